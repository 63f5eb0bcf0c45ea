"""TRM4Rec: weight sharing across steps, and ACT halting checked against hand-computed mixes."""

import math
from typing import Any

import pytest
import torch

from retriever.backbones.trm4rec import TRM4Rec, TRM4RecConfig
from retriever.config import config_from_dict
from retriever.layers import attention_mask, rope_tables
from retriever.losses import LossContext, compute_loss
from retriever.model import Retriever
from retriever.train import train_step

N_ITEMS = 30


def _model(**changes: Any) -> TRM4Rec:
    torch.manual_seed(0)
    params: dict[str, Any] = {"d_model": 16, "n_heads": 2, "max_len": 12, "dropout": 0.0, "emb_dropout": 0.0}
    return TRM4Rec(TRM4RecConfig(n_items=N_ITEMS, **{**params, **changes})).eval()


def _set_halting(model: TRM4Rec, probability: float) -> None:
    """Every position halts with the same probability at every step (weights zero, bias = logit)."""
    assert model.halt is not None
    with torch.no_grad():
        model.halt.weight.zero_()
        model.halt.bias.fill_(math.log(probability / (1 - probability)))


def _without_halting(model: TRM4Rec, n_steps: int) -> TRM4Rec:
    """The same weights run for a fixed number of steps."""
    fixed = _model(n_steps=n_steps)
    fixed.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("halt.")})
    return fixed


def _count_steps(model: TRM4Rec) -> list[int]:
    calls: list[int] = []
    model.blocks[0].register_forward_hook(lambda *_: calls.append(1))
    return calls


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_steps_share_weights_so_parameters_do_not_grow_with_depth() -> None:
    s1, s4, s16, s4b2 = _model(n_steps=1), _model(n_steps=4), _model(n_steps=16), _model(n_steps=4, n_blocks=2)
    block = _n_params(s1.blocks[0])
    assert _n_params(s1) == _n_params(s4) == _n_params(s16) == (N_ITEMS + 1) * 16 + block + 16  # + final norm
    assert _n_params(s4b2) == _n_params(s4) + block


def test_s_steps_apply_the_same_blocks_s_times() -> None:
    model = _model(n_steps=3, n_blocks=2)
    ids = torch.tensor([[0, 0, 4, 7, 2, 9], [1, 2, 3, 4, 5, 6]])
    x = model.item_emb(ids)
    mask, rope = attention_mask(ids), rope_tables(6, 8)
    for _ in range(3):
        for block in model.blocks:
            x = block(x, mask, rope)
    assert torch.allclose(model(ids), model.norm(x), atol=1e-6)
    assert model.last_average_steps == 3.0


def test_halting_forced_at_the_first_step_runs_one_step() -> None:
    model = _model(n_steps=8, adaptive=True)
    _set_halting(model, 1 - 1e-6)
    calls = _count_steps(model)
    ids = torch.randint(1, N_ITEMS + 1, (3, 7))
    out = model(ids)
    assert len(calls) == 1  # the loop ends once every position halted, in eval
    assert model.last_average_steps == 1.0
    assert torch.allclose(out, _without_halting(model, n_steps=1)(ids), atol=1e-5)  # all weight on the only state


def test_halting_mix_matches_the_hand_computed_act_weights() -> None:
    """p = 0.4 every step, threshold 0.99: 0.4 + 0.4 < 0.99 <= 1.2, so N = 3 and R = 0.2."""
    model = _model(n_steps=6, adaptive=True).train()  # no dropout in _model: train mode only records the cost
    _set_halting(model, 0.4)
    ids = torch.tensor([[0, 3, 5, 7], [2, 4, 6, 8]])
    out = model(ids)
    states, x = [], model.item_emb(ids)
    for _ in range(3):
        x = model.blocks[0](x, attention_mask(ids), rope_tables(4, 8))
        states.append(x)
    expected = model.norm(0.4 * states[0] + 0.4 * states[1] + 0.2 * states[2])
    real = ids != 0
    assert torch.allclose(out[real], expected[real], atol=1e-5)
    assert torch.equal(out[~real], torch.zeros_like(out[~real]))  # padding never runs
    assert model.last_average_steps == 3.0
    assert model.auxiliary_loss().item() == pytest.approx(0.01 * 3.2, abs=1e-6)  # tau * (N + R)


def test_a_position_that_never_halts_uses_the_whole_budget() -> None:
    model = _model(n_steps=5, adaptive=True)
    _set_halting(model, 1e-6)
    calls = _count_steps(model)
    ids = torch.randint(1, N_ITEMS + 1, (2, 6))
    out = model(ids)
    assert len(calls) == 5
    assert model.last_average_steps == 5.0
    # the remainder (~1) goes to the last state
    assert torch.allclose(out, _without_halting(model, n_steps=5)(ids), atol=1e-4)


def test_ponder_cost_is_positive_differentiable_and_read_once() -> None:
    model = _model(n_steps=4, adaptive=True).train()
    ids = torch.randint(1, N_ITEMS + 1, (4, 6))
    model(ids)
    cost = model.auxiliary_loss()
    assert cost.item() > 0
    cost.backward()
    assert model.halt is not None
    assert model.halt.bias.grad is not None
    assert model.halt.bias.grad.abs().item() > 0
    assert model.auxiliary_loss().item() == 0.0  # released: a second read adds nothing
    with torch.no_grad():
        model.eval()(ids)  # evaluation forwards leave no cost behind
    assert model.auxiliary_loss().item() == 0.0
    assert _model(n_steps=4).train().auxiliary_loss().item() == 0.0  # not adaptive


def test_the_training_step_adds_the_ponder_cost() -> None:
    config = config_from_dict({
        "model": {"backbone": "trm4rec", "d_model": 16, "n_heads": 2, "max_len": 8, "n_steps": 3, "adaptive": True,
                  "ponder_cost": 0.5, "dropout": 0.0, "emb_dropout": 0.0},
        "loss": {"name": "full"},
    })
    torch.manual_seed(0)
    model = config.build(N_ITEMS).train()
    batch = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    ctx = LossContext(temperature=model.temperature, project=model._project, generator=torch.Generator())
    inputs, targets = batch[:, :-1], batch[:, 1:]
    trained = inputs != 0
    with torch.no_grad():
        hidden = model.hidden(inputs)
        main = compute_loss("full", hidden[trained], targets[trained], model.encoder.item_embeddings(), ctx)
        ponder = model.encoder.auxiliary_loss()  # type: ignore[attr-defined]
    loss, _ = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.0), config, ctx)
    assert ponder.item() > 0.5  # at least one step per position, times 0.5
    assert loss == pytest.approx((main + ponder).item(), rel=1e-5)


def _varied_halting_model() -> TRM4Rec:
    """Halting that depends strongly on the state, so positions stop at different steps."""
    model = _model(n_steps=6, adaptive=True, halt_threshold=0.9)
    assert model.halt is not None
    with torch.no_grad():
        model.halt.weight.normal_(0.0, 20.0)
        model.halt.bias.fill_(-0.5)
    return model


def test_adaptive_halting_keeps_causality_padding_and_the_last_position_shortcut() -> None:
    model = _varied_halting_model()
    torch.manual_seed(1)
    ids = torch.randint(1, N_ITEMS + 1, (4, 9))
    out = model(ids)
    steps = model.last_average_steps
    assert 1.0 < steps < 6.0
    assert steps != round(steps)

    changed = ids.clone()
    changed[:, 5] = ids[:, 5] % N_ITEMS + 1
    after = model(changed)
    assert torch.allclose(out[:, :5], after[:, :5], atol=1e-5)
    assert not torch.allclose(out[:, 5:], after[:, 5:], atol=1e-5)

    retriever = Retriever(model)
    padded = torch.cat([torch.zeros(4, 3, dtype=torch.long), ids], dim=1)
    assert torch.allclose(retriever.user_vectors(ids), retriever.user_vectors(padded), atol=1e-5)
    assert torch.allclose(model.encode_last(ids), out[:, -1], atol=1e-5)


class _LastPositionHalts(torch.nn.Module):
    """A halting unit that stops the last position at once and never the others."""

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        logits = torch.full(state.shape[:-1], -20.0)
        logits[:, -1] = 20.0
        return logits.unsqueeze(-1)  # (B, T, 1)


def test_the_last_position_shortcut_stops_when_the_last_positions_halt() -> None:
    model = _model(n_steps=6, adaptive=True)
    model.halt = _LastPositionHalts()  # type: ignore[assignment]
    ids = torch.randint(1, N_ITEMS + 1, (3, 7))
    calls = _count_steps(model)
    out = model(ids)
    assert len(calls) == 6  # the other positions use the whole budget
    calls.clear()
    last = model.encode_last(ids)
    assert len(calls) == 1
    assert model.last_average_steps == 1.0
    assert torch.allclose(last, out[:, -1], atol=1e-6)


@pytest.mark.parametrize(("key", "value"), [("n_steps", 0), ("n_blocks", 0), ("halt_threshold", 1.5),
                                            ("ponder_cost", -1.0)])
def test_invalid_options_are_rejected(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=key):
        _model(**{key: value})
