"""LightSANs: the causal item-to-interest aggregation against a plain per-prefix reference."""

import pytest
import torch

from retriever.backbones.lightsans import LightSANs, LightSANsConfig, causal_interests

N_ITEMS = 20


def _reference_interests(x: torch.Tensor, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The paper's aggregation (softmax over positions, weighted sum) run once per prefix."""
    B, T, D = x.shape
    k = scores.shape[-1]
    out = torch.zeros(B, T, k, D)
    for b in range(B):
        for t in range(T):
            keep = real[b, : t + 1]
            if not keep.any():
                continue
            weights = scores[b, : t + 1][keep].softmax(dim=0)  # (n, k)
            out[b, t] = weights.T @ x[b, : t + 1][keep]
    return out


def _encoder(**changes: int) -> LightSANs:
    torch.manual_seed(0)
    params = {"max_len": 10, "d_model": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.0, **changes}
    config = LightSANsConfig(n_items=N_ITEMS, **params)  # type: ignore[arg-type]
    return LightSANs(config).eval()


def test_causal_interests_match_a_per_prefix_softmax() -> None:
    torch.manual_seed(0)
    x, scores = torch.randn(3, 7, 4), 3 * torch.randn(3, 7, 5)
    real = torch.ones(3, 7, dtype=torch.bool)
    real[1, :3] = False  # left padding
    real[2, :] = False  # a row of padding only: zeros, not NaN
    out = causal_interests(x, scores, real)
    assert out.shape == (3, 7, 5, 4)
    assert torch.allclose(out, _reference_interests(x, scores, real), atol=1e-5)


def test_the_last_prefix_is_the_papers_whole_sequence_aggregation() -> None:
    torch.manual_seed(1)
    x, scores = torch.randn(2, 6, 4), torch.randn(2, 6, 3)
    out = causal_interests(x, scores, torch.ones(2, 6, dtype=torch.bool))
    whole = torch.einsum("btk,btd->bkd", scores.softmax(dim=1), x)  # (B, k, D)
    assert torch.allclose(out[:, -1], whole, atol=1e-5)


def test_extreme_scores_stay_finite_and_causal() -> None:
    torch.manual_seed(2)
    x, scores = torch.randn(1, 6, 4), torch.randn(1, 6, 2)
    real = torch.ones(1, 6, dtype=torch.bool)
    spiked = scores.clone()
    spiked[0, 4] = 1e6  # a later position with a huge score
    a, b = causal_interests(x, scores, real), causal_interests(x, spiked, real)
    assert torch.isfinite(b).all()
    assert torch.equal(a[:, :4], b[:, :4])
    assert torch.allclose(b[0, 4], x[0, 4].expand(2, 4), atol=1e-5)  # that position takes all the weight


def test_encoder_is_causal_even_with_large_aggregation_weights() -> None:
    encoder = _encoder()
    with torch.no_grad():
        for block in encoder.blocks:
            block.attn.key_theta.mul_(1e4)  # type: ignore[union-attr, operator]
            block.attn.value_theta.mul_(1e4)  # type: ignore[union-attr, operator]
    ids = torch.randint(1, N_ITEMS + 1, (2, 8))
    changed = ids.clone()
    changed[:, 6] = ids[:, 6] % N_ITEMS + 1
    a, b = encoder(ids), encoder(changed)
    assert torch.isfinite(a).all()
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)


def test_k_interests_sizes_the_aggregation() -> None:
    encoder = _encoder(k_interests=3)
    assert encoder.blocks[0].attn.key_theta.shape == (16, 3)  # type: ignore[union-attr]
    assert encoder(torch.randint(1, N_ITEMS + 1, (2, 5))).shape == (2, 5, 16)
    with pytest.raises(ValueError, match="k_interests"):
        _encoder(k_interests=0)


def test_order_reaches_the_last_position_only_through_the_position_term() -> None:
    """Interest aggregation is a weighted set sum: in one layer, reordering the history moves the last
    position's state only through the position term."""
    encoder = _encoder(n_layers=1)
    with torch.no_grad():
        encoder.blocks[0].attn.pos_qk.weight.normal_()  # type: ignore[union-attr, operator]  # positions matter
    ids = torch.tensor([[3, 8, 1, 6, 2]])
    reordered = torch.tensor([[1, 6, 3, 8, 2]])  # same items, same last item
    assert not torch.allclose(encoder(ids)[:, -1], encoder(reordered)[:, -1], atol=1e-4)
    with torch.no_grad():
        encoder.pos_emb.weight.zero_()
    assert torch.allclose(encoder(ids)[:, -1], encoder(reordered)[:, -1], atol=1e-5)
