"""Llama-style building blocks shared by the sequence encoders.

RMSNorm is computed in fp32 (bf16 sums of squares lose precision), SwiGLU is
``down(silu(gate(x)) * up(x))``, RoPE is a pair of pure functions whose cos/sin tables
are computed once per forward and shared by every layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """Gated feed-forward; hidden = expansion * dim (retriever-and-ranker reference: 4 works, 8/3 does not)."""

    def __init__(self, dim: int, expansion: float = 4.0, dropout: float = 0.0) -> None:
        super().__init__()
        hidden = int(dim * expansion)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.silu(self.gate(x)) * self.up(x)))


def rope_tables(length: int, head_dim: int, *, base: float = 10_000.0, device: torch.device | None = None) -> tuple[
    Tensor, Tensor
]:
    """cos, sin of shape (length, head_dim // 2) for positions 0..length-1."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, T, hd) queries or keys; pairs are (first half, second half) of hd."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.to(x.dtype)


def attention_mask(item_ids: Tensor, *, causal: bool = True) -> Tensor:
    """(B, 1, T, T) bool, True = may attend: real keys only (causal: not in the future).

    Every position may also attend to itself, so rows of padding queries are never empty
    (SDPA would return NaN for them); their outputs are ignored downstream.
    """
    position = torch.arange(item_ids.shape[1], device=item_ids.device)
    query, key = position[:, None], position[None, :]  # (T, 1), (1, T); comparisons rather than eye/tril,
    allowed = (item_ids != 0)[:, None, None, :]  # (B, 1, 1, T) keys      which export to ONNX at any T
    if causal:
        allowed = allowed & (key <= query)
    return allowed | (key == query)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0, *, rope: bool = True) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"d_model {dim} is not divisible by n_heads {n_heads}")
        if rope and dim // n_heads % 2:  # found here, not at the first forward pass, mid-training
            raise ValueError(f"RoPE needs an even head dimension: d_model {dim} / n_heads {n_heads} = {dim // n_heads}")
        self.n_heads = n_heads
        self.rope = rope
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.out_dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor] | None = None, *, last_only: bool = False
    ) -> Tensor:
        """(B, T, D) -> (B, T, D), or (B, 1, D) for the last query alone when last_only (inference)."""
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        q, k, v = self.qkv(x).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        if self.rope and rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if last_only:
            q, mask = q[:, :, -1:], mask[:, :, -1:]  # (B, H, 1, hd), (B, 1, 1, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, q.shape[2], D)  # (B, T or 1, D)
        return self.out_dropout(self.out(y))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, dim: int, n_heads: int, dropout: float, expansion: float = 4.0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = SelfAttention(dim, n_heads, dropout)
        self.ffn_norm = RMSNorm(dim)
        self.ffn = SwiGLU(dim, expansion, dropout)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor], *, last_only: bool = False) -> Tensor:
        """last_only: compute only the last position's output, (B, 1, D); the final block at inference."""
        attended = self.attn(self.attn_norm(x), mask, rope, last_only=last_only)
        x = (x[:, -1:] if last_only else x) + attended
        return x + self.ffn(self.ffn_norm(x))


Init = Callable[[Tensor], object]


def _normal(weight: Tensor) -> object:
    return nn.init.normal_(weight, std=0.02)


def init_module(module: nn.Module, *, linear: Init = _normal, embedding: Init = _normal,
                padding: Literal["first", "declared"] = "declared") -> None:
    """Initialise one module for ``nn.Module.apply``: Linear weights by ``linear`` and zero biases,
    Embedding weights by ``embedding``, then the padding row zeroed: row 0 ("first") or the
    embedding's declared ``padding_idx`` ("declared", none if it declares none)."""
    if isinstance(module, nn.Linear):
        linear(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        embedding(module.weight)
        row = 0 if padding == "first" else module.padding_idx
        if row is not None:
            with torch.no_grad():
                module.weight[row].zero_()


def init_weights(module: nn.Module) -> None:
    """GPT-2 style init (normal 0.02, zero biases); row 0 of every embedding (padding) zeroed."""
    init_module(module, padding="first")


def init_weights_padding_idx(module: nn.Module) -> None:
    """As `init_weights`, but zero only an embedding's declared ``padding_idx`` row."""
    init_module(module)
