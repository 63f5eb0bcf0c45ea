import torch
import torch.nn.functional as F

from retriever.layers import RMSNorm, SelfAttention, SwiGLU, apply_rope, attention_mask, rope_tables


def test_rope_dot_product_depends_only_on_relative_offset() -> None:
    torch.manual_seed(0)
    hd = 16
    q, k = torch.randn(hd), torch.randn(hd)
    cos, sin = rope_tables(64, hd)

    def rotated_dot(m: int, n: int) -> float:
        qm = apply_rope(q.view(1, 1, 1, hd), cos[m], sin[m])
        kn = apply_rope(k.view(1, 1, 1, hd), cos[n], sin[n])
        return float((qm * kn).sum())

    assert abs(rotated_dot(3, 1) - rotated_dot(40, 38)) < 1e-4
    assert abs(rotated_dot(10, 10) - rotated_dot(0, 0)) < 1e-4
    assert abs(rotated_dot(0, 0) - float(q @ k)) < 1e-4  # position 0 is the identity rotation
    by_offset = [rotated_dot(20, 20 - d) for d in range(10)]
    assert max(by_offset) - min(by_offset) > 0.1  # positions do matter, through the offset


def test_rope_preserves_norm() -> None:
    x = torch.randn(2, 3, 7, 8)
    cos, sin = rope_tables(7, 8)
    assert torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_rmsnorm_matches_formula() -> None:
    x = torch.randn(4, 10)
    norm = RMSNorm(10)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(10.0))
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * torch.arange(10.0)
    assert torch.allclose(norm(x), expected, atol=1e-5)


def test_swiglu_is_down_of_silu_gate_times_up() -> None:
    ffn = SwiGLU(8, expansion=4).eval()
    assert ffn.gate.out_features == 32
    x = torch.randn(3, 8)
    assert torch.allclose(ffn(x), ffn.down(F.silu(ffn.gate(x)) * ffn.up(x)))


def test_attention_mask_hides_padding_and_future() -> None:
    ids = torch.tensor([[0, 0, 5, 6]])
    mask = attention_mask(ids)[0, 0]
    expected = torch.tensor(
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(mask, expected)


def test_sdpa_attention_matches_hand_written_softmax_attention() -> None:
    torch.manual_seed(1)
    attn = SelfAttention(16, 4, rope=False).eval()
    x = torch.randn(2, 5, 16)
    ids = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    mask = attention_mask(ids)
    got = attn(x, mask)
    q, k, v = attn.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    logits = (q @ k.transpose(-1, -2)) / 2.0  # sqrt(head_dim = 4)
    weights = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    expected = attn.out((weights @ v).transpose(1, 2).reshape(2, 5, 16))
    assert torch.allclose(got, expected, atol=1e-5)
