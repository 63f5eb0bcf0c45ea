"""mLSTM: the chunkwise-parallel form against the step-by-step form and the unstabilised definition."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from retriever.backbones.xlstm import XLSTM, XLSTMConfig, mlstm_chunkwise, mlstm_recurrent


def _cell_inputs(
    B: int = 3, H: int = 2, T: int = 10, dh: int = 4, *, gate_scale: float = 2.0, pad: tuple[int, ...] = (0, 3, 7),
    forget: str = "sigmoid", dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, dh, generator=g, dtype=dtype) for _ in range(3))
    pre_f = torch.randn(B, H, T, generator=g, dtype=dtype) * gate_scale + 2.0
    log_i = torch.randn(B, H, T, generator=g, dtype=dtype) * gate_scale
    log_f = F.logsigmoid(pre_f) if forget == "sigmoid" else pre_f * 0.5
    padding = torch.arange(T)[None, :] < torch.tensor(pad)[:, None]  # (B, T): row b has pad[b] leading pads
    log_f = log_f.masked_fill(padding[:, None], 0.0)
    log_i = log_i.masked_fill(padding[:, None], -torch.inf)
    return q, k, v, log_f, log_i


def _unstabilised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor, log_i: torch.Tensor
                  ) -> torch.Tensor:
    """The paper's equations without the stabiliser: h_t = C_t q_t / max(|n_t^T q_t|, 1)."""
    T = q.shape[2]
    cum = log_f.cumsum(-1)  # (B, H, T)
    weight = torch.exp(cum[..., :, None] - cum[..., None, :] + log_i[..., None, :])  # (B, H, T, T): w[t, s]
    weight = weight * torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2)) * weight
    return (scores @ v) / torch.clamp(scores.sum(-1).abs(), min=1.0)[..., None]


@pytest.mark.parametrize("forget", ["sigmoid", "exp"])
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 10, 64])
def test_chunkwise_matches_recurrent_and_the_definition(forget: str, chunk_size: int) -> None:
    inputs = _cell_inputs(forget=forget)
    recurrent = mlstm_recurrent(*inputs)
    chunkwise = mlstm_chunkwise(*inputs, chunk_size=chunk_size)
    assert torch.allclose(chunkwise, recurrent, rtol=1e-10, atol=1e-12)
    assert torch.allclose(recurrent, _unstabilised(*inputs), rtol=1e-10, atol=1e-12)


def test_padding_steps_leave_the_state_untouched() -> None:
    q, k, v, log_f, log_i = _cell_inputs(pad=(0, 0, 0))
    pad = 5
    padded = [torch.cat([torch.randn_like(t[:, :, :pad]), t], dim=2) for t in (q, k, v)]  # junk q, k, v on pads
    padded_f = F.pad(log_f, (pad, 0), value=0.0)
    padded_i = F.pad(log_i, (pad, 0), value=-torch.inf)
    for form in (mlstm_recurrent, lambda *a: mlstm_chunkwise(*a, chunk_size=4)):
        plain = form(q, k, v, log_f, log_i)
        assert torch.allclose(form(*padded, padded_f, padded_i)[:, :, pad:], plain, rtol=1e-12, atol=1e-14)


def test_stabiliser_keeps_float32_finite_where_exp_overflows() -> None:
    inputs64 = _cell_inputs(gate_scale=40.0)  # input gates up to ~e^100: exp() overflows float32
    inputs32 = [t.float() for t in inputs64]
    assert not torch.isfinite(torch.exp(inputs32[4][inputs32[4] > 0])).all()
    reference = mlstm_recurrent(*inputs64)
    for out in (mlstm_recurrent(*inputs32), mlstm_chunkwise(*inputs32, chunk_size=4)):
        assert torch.isfinite(out).all()
        assert torch.allclose(out.double(), reference, rtol=1e-3, atol=1e-4)


def _pair(**changes: object) -> tuple[XLSTM, XLSTM]:
    torch.manual_seed(0)
    config = XLSTMConfig(n_items=30, d_model=16, n_layers=2, n_heads=2, dropout=0.0, emb_dropout=0.0,
                         chunk_size=3, **changes)  # type: ignore[arg-type]
    chunkwise = XLSTM(config).double().eval()
    recurrent = XLSTM(dataclasses.replace(config, form="recurrent")).double().eval()
    recurrent.load_state_dict(chunkwise.state_dict())
    with torch.no_grad():  # move the gates off their input-independent start so the test sees them work
        for model in (chunkwise, recurrent):
            for block in model.blocks:
                block.mlstm.gates.weight.copy_(torch.linspace(-0.5, 0.5, block.mlstm.gates.weight.numel())
                                               .view_as(block.mlstm.gates.weight))
    return chunkwise, recurrent


@pytest.mark.parametrize("forget", ["sigmoid", "exp"])
def test_encoder_forms_agree_with_left_padding(forget: str) -> None:
    chunkwise, recurrent = _pair(forget_gate=forget)
    ids = torch.randint(1, 31, (3, 11), generator=torch.Generator().manual_seed(1))
    ids[1, :4] = 0
    ids[2, :9] = 0
    real = ids != 0
    a, b = chunkwise(ids), recurrent(ids)
    assert torch.allclose(a[real], b[real], rtol=1e-9, atol=1e-11)
    # and extra left padding changes no real position, in either form
    padded = F.pad(ids, (6, 0))
    assert torch.allclose(chunkwise(padded)[:, 6:][real], a[real], rtol=1e-9, atol=1e-11)
    assert torch.allclose(recurrent(padded)[:, 6:][real], b[real], rtol=1e-9, atol=1e-11)


def test_forms_give_the_same_gradients() -> None:
    chunkwise, recurrent = _pair()
    ids = torch.randint(1, 31, (2, 8), generator=torch.Generator().manual_seed(2))
    ids[0, :3] = 0
    chunkwise(ids).pow(2).sum().backward()
    recurrent(ids).pow(2).sum().backward()
    for (name, p), q in zip(chunkwise.named_parameters(), recurrent.parameters(), strict=True):
        assert p.grad is not None, name
        assert q.grad is not None, name
        assert torch.allclose(p.grad, q.grad, rtol=1e-8, atol=1e-11), name


def test_gate_initialisation_gives_long_memories() -> None:
    model = XLSTM(XLSTMConfig(n_items=5, d_model=8, n_heads=4))
    forget_bias = model.blocks[0].mlstm.gates.bias[4:]
    assert torch.allclose(forget_bias, torch.linspace(3.0, 6.0, 4))
    assert torch.equal(model.blocks[0].mlstm.gates.weight, torch.zeros(8, 48))


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="divisible"):
        XLSTM(XLSTMConfig(n_items=5, d_model=8, n_heads=3))
    with pytest.raises(ValueError, match="forget_gate"):
        XLSTM(XLSTMConfig(n_items=5, forget_gate="tanh"))  # type: ignore[arg-type]
