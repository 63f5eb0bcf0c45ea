"""HSTU: the pointwise attention layer against a hand-written loop, buckets, and the optional time bias."""

import math

import pytest
import torch
import torch.nn.functional as F

from retriever.backbones.hstu import HSTU, HSTUConfig, HSTULayer, position_buckets, time_buckets

N_ITEMS = 20


def _encoder(**changes: int) -> HSTU:
    torch.manual_seed(0)
    params = {"max_len": 10, "d_model": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.0, **changes}
    config = HSTUConfig(n_items=N_ITEMS, **params)  # type: ignore[arg-type]
    encoder = HSTU(config).eval()
    with torch.no_grad():  # biases start near zero; make them matter in these tests
        for layer in encoder.layers:
            layer.pos_bias.weight.normal_(std=1.0)  # type: ignore[union-attr, operator]
            if layer.time_bias is not None:
                layer.time_bias.weight.normal_(std=1.0)  # type: ignore[union-attr, operator]
    return encoder


def _reference_layer(layer: HSTULayer, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """One query at a time: y_i = sum_{j <= i, real} SiLU(q_i . k_j + rab(i - j)) / max_len * v_j."""
    B, T, D = x.shape
    H, hd = layer.n_heads, D // layer.n_heads
    u, v, q, k = F.silu(layer.f1(F.layer_norm(x, (D,)))).chunk(4, dim=-1)
    out = torch.zeros(B, T, D)
    for b in range(B):
        for i in range(T):
            heads = []
            for h in range(H):
                part = slice(h * hd, (h + 1) * hd)
                acc = torch.zeros(hd)
                for j in range(i + 1):
                    if real[b, j]:
                        bucket = position_buckets(torch.tensor(i - j), layer.n_pos_buckets, layer.max_len)
                        score = q[b, i, part] @ k[b, j, part] + layer.pos_bias.weight[bucket, h]
                        acc = acc + F.silu(score) / layer.max_len * v[b, j, part]
                heads.append(acc)
            out[b, i] = torch.cat(heads)
    return x + layer.f2(F.layer_norm(out, (D,)) * u)


def test_layer_matches_a_per_query_loop() -> None:
    layer = _encoder().layers[0]
    torch.manual_seed(1)
    x = torch.randn(2, 6, 16)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[1, :2] = False
    index = torch.arange(6)
    distance = index[:, None] - index[None, :]
    keep = ((distance >= 0)[None] & real[:, None, :]).unsqueeze(1).float()
    with torch.no_grad():
        fast = layer(x, keep, distance, None)
        slow = _reference_layer(layer, x, real)  # type: ignore[arg-type]
    assert torch.allclose(fast, slow, atol=1e-5)


def test_position_buckets_are_exact_then_logarithmic() -> None:
    distance = torch.arange(200)
    buckets = position_buckets(distance, 32, 200)
    assert torch.equal(buckets[:16], torch.arange(16))  # exact below n_buckets // 2
    assert (buckets.diff() >= 0).all()
    assert int(buckets.max()) <= 31
    assert int(buckets[199]) == 31
    assert torch.equal(position_buckets(torch.arange(8), 32, 8), torch.arange(8))  # short max_len: all exact


def test_time_buckets_follow_the_reference_log_scale() -> None:
    gaps = torch.tensor([0, 1, 2, 10, 3600, 86_400, -10, 10**18])
    expected = [0, 0, int(math.log(2) / 0.301), int(math.log(10) / 0.301), int(math.log(3600) / 0.301),
                int(math.log(86_400) / 0.301), int(math.log(10) / 0.301), 128]
    assert time_buckets(gaps, 128).tolist() == expected


def test_timestamps_add_a_time_bias_and_stay_causal() -> None:
    encoder = _encoder()
    ids = torch.randint(1, N_ITEMS + 1, (2, 7))
    ts = torch.cumsum(torch.randint(1, 100_000, (2, 7)), dim=1)
    with_time = encoder(ids, ts)
    assert not torch.allclose(with_time, encoder(ids), atol=1e-4)
    later = ts.clone()
    later[:, 5:] += 10**7  # the next items' times: never an input to earlier positions
    assert torch.allclose(encoder(ids, later)[:, :5], with_time[:, :5], atol=1e-5)


def test_timestamps_keep_left_padding_invariance() -> None:
    encoder = _encoder()
    ids = torch.randint(1, N_ITEMS + 1, (2, 5))
    ts = torch.cumsum(torch.randint(1, 1000, (2, 5)), dim=1) + 10**9
    pad = torch.zeros(2, 3, dtype=torch.long)
    padded = encoder(torch.cat([pad, ids], dim=1), torch.cat([pad, ts], dim=1))
    assert torch.allclose(padded[:, 3:], encoder(ids, ts), atol=1e-5)


def test_time_bias_can_be_switched_off() -> None:
    encoder = _encoder(n_time_buckets=0)
    assert all(layer.time_bias is None for layer in encoder.layers)
    ids = torch.randint(1, N_ITEMS + 1, (2, 5))
    assert torch.equal(encoder(ids, torch.arange(10).view(2, 5)), encoder(ids))


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="n_pos_buckets"):
        _encoder(n_pos_buckets=0)
    with pytest.raises(ValueError, match="divisible"):
        _encoder(n_heads=3)
