"""PCRec: its updates are gradient steps on the prediction-error energy (PCRec-simple, which
works with every causal backbone, is tested with the retriever in test_model.py)."""

import dataclasses

import pytest
import torch

from retriever.backbones.pcrec import ACTIVATIONS, PCRec, PCRecConfig, PredictiveCoding, energy

N_ITEMS = 30


def _hierarchy(diagonal: bool = False) -> tuple[PredictiveCoding, list[torch.Tensor], list[torch.Tensor], torch.Tensor,
                                                  torch.Tensor]:
    """A PC module with random rates, 3 random states (B=2, T=5, D=4) and 2 random causal thetas, in float64."""
    torch.manual_seed(0)
    pc = PredictiveCoding(PCRecConfig(n_items=1, max_len=5, d_model=4, n_layers=2, alpha=0.7)).double()
    for rate in pc.rates:
        torch.nn.init.normal_(rate.weight)
    B, T, D = 2, 5, 4
    states = [torch.randn(B, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    allowed = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    if diagonal:
        allowed = torch.eye(T, dtype=torch.bool).expand(B, T, T)
    thetas = [(torch.randn(B, T, T, dtype=torch.float64) * allowed).requires_grad_() for _ in range(2)]
    keep = torch.ones(B, T, 1, dtype=torch.float64)
    return pc, states, thetas, keep, allowed


def test_activity_update_is_a_gradient_step_on_the_energy_at_the_last_position() -> None:
    pc, states, thetas, keep, _ = _hierarchy()
    errors = pc.errors(states, thetas, keep)
    grads = torch.autograd.grad(energy(errors).sum(), states)
    updated = pc.update_states(states, thetas, errors)
    for j, (s, new, grad) in enumerate(zip(states, updated, grads, strict=True)):
        gamma = torch.sigmoid(pc.rates[j](s))  # (B, T, 1)
        # the last position of a prefix has no later position whose error it could receive: exact there
        assert torch.allclose((new - s)[:, -1], -(gamma * grad)[:, -1], atol=1e-12), j
        # earlier positions drop the later positions' errors (causality), so they differ from the full gradient
        assert not torch.allclose((new - s)[:, :-1], -(gamma * grad)[:, :-1], atol=1e-6) or j == 2


def test_activity_update_is_the_full_gradient_step_when_theta_is_diagonal() -> None:
    pc, states, thetas, keep, _ = _hierarchy(diagonal=True)
    errors = pc.errors(states, thetas, keep)
    grads = torch.autograd.grad(energy(errors).sum(), states)
    for j, (s, new, grad) in enumerate(zip(states, pc.update_states(states, thetas, errors), grads, strict=True)):
        assert torch.allclose(new - s, -torch.sigmoid(pc.rates[j](s)) * grad, atol=1e-12), j


def test_weight_update_is_a_gradient_step_on_the_energy() -> None:
    pc, states, thetas, keep, allowed = _hierarchy()
    errors = pc.errors(states, thetas, keep)
    grads = torch.autograd.grad(energy(errors).sum(), thetas)
    updated = pc.update_weights(states, thetas, errors, keep, allowed)
    assert pc.alpha == pytest.approx(0.7 / (4 * 5))
    for theta, new, grad in zip(thetas, updated, grads, strict=True):
        assert torch.allclose(new - theta, -pc.alpha * grad * allowed, atol=1e-12)
        assert torch.equal((new - theta)[~allowed], torch.zeros(int((~allowed).sum()), dtype=torch.float64))


def _model(**changes: object) -> PCRec:
    torch.manual_seed(0)
    config = PCRecConfig(n_items=N_ITEMS, max_len=12, d_model=16, n_layers=2, n_heads=2, dropout=0.0,
                         emb_dropout=0.0)
    return PCRec(dataclasses.replace(config, **changes)).double().eval()  # type: ignore[arg-type]


def _ids() -> torch.Tensor:
    ids = torch.randint(1, N_ITEMS + 1, (3, 9), generator=torch.Generator().manual_seed(1))
    ids[1, :3] = 0
    return ids


def test_one_relaxation_step_lowers_the_energy() -> None:
    model = _model()
    ids = _ids()
    states = model.states(ids, relax=False)
    real = ids != 0
    keep = real.unsqueeze(-1).double()
    T = ids.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & real[:, :, None] & real[:, None, :]
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0)
    with torch.no_grad():
        model.pc.theta.normal_(0.0, 0.3)
    thetas = model.pc.base_thetas(allowed, distance)
    before = energy(model.pc.errors(states, thetas, keep))
    relaxed = model.pc.update_states(states, thetas, model.pc.errors(states, thetas, keep))
    after = energy(model.pc.errors(relaxed, thetas, keep))
    assert (after < before).all()


def test_without_prediction_errors_it_is_the_plain_hstu_stack() -> None:
    plain = _model(pc_steps=0)
    coded = _model(pc_steps=3)
    coded.load_state_dict(plain.state_dict())
    ids = _ids()
    real = ids != 0
    assert not torch.allclose(plain(ids)[real], coded(ids)[real], atol=1e-6)  # the updates do act
    with torch.no_grad():
        for rate in coded.pc.rates:  # gamma = 0: activities never move
            rate.weight.zero_()
            rate.bias.fill_(-1e4)
    assert torch.equal(plain(ids)[real], coded(ids)[real])


def test_the_weight_update_reaches_the_output_from_the_second_step_on() -> None:
    ids = _ids()
    for steps, should_change in ((1, False), (2, True)):
        outputs = []
        for alpha in (0.0, 5.0):
            model = _model(pc_steps=steps, alpha=alpha)
            with torch.no_grad():
                model.pc.theta.normal_(0.0, 0.3)  # a non-zero base theta, so the backward term is live too
            outputs.append(model(ids)[ids != 0])
        assert torch.allclose(outputs[0], outputs[1], atol=1e-9) != should_change, steps


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_derivatives(name: str) -> None:
    f, f_prime = ACTIVATIONS[name]
    x = torch.linspace(-3, 3, 13, dtype=torch.float64).add(0.01).requires_grad_()  # 0.01: avoid relu's kink
    (grad,) = torch.autograd.grad(f(x).sum(), x)
    assert torch.allclose(f_prime(x), grad, atol=1e-12)


def test_base_theta_and_positions_ignore_left_padding_at_every_position() -> None:
    model = _model()
    ids = _ids()
    padded = torch.nn.functional.pad(ids, (3, 0))
    real = ids != 0
    assert torch.allclose(model(padded)[:, 3:][real], model(ids)[real], atol=1e-12)


def test_unknown_activation_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="activation"):
        PCRec(PCRecConfig(n_items=5, activation="gelu"))  # type: ignore[arg-type]
