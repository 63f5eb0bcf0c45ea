"""BSARec (Shin et al., AAAI 2024, "An Attentive Inductive Bias for Sequential Recommendation beyond
the Self-Attention"), as its authors' code builds it: every layer mixes a frequency filter with
self-attention, ``alpha * filter(x) + (1 - alpha) * attention(x)``, then a GELU feed-forward.

The filter splits the sequence into its ``c // 2 + 1`` lowest frequencies along time and the rest,
and rescales the high part by a learned ``beta ** 2`` per dimension. It mixes every position of the
window, so no state is causal: the model trains on one target per window, its last position
(``train.windows: prefixes``), and reads a user at the last position like any encoder. Because the
filter sees the whole window, every input is left-padded to exactly ``max_len`` inside the encoder,
so a user's vector does not depend on the width of the batch it is encoded in (training, evaluation
and serving see the same padding). The low-pass part is a fixed (max_len, max_len) real matrix,
built once from ``torch.fft``: the same numbers as the authors' rfft/irfft pair, a plain matmul that
runs under bf16 autocast and exports to ONNX.

Kept from the authors' code where it shapes results: learned absolute positions, post-norm
LayerNorm (eps 1e-12) after each sublayer, the additive -10000 attention mask (causal, padding keys
masked; a padding query attends uniformly to every key), normal(0.02) init with ``beta`` drawn from
a standard normal, and dot-product scores (``model.similarity: dot``, ``temperature: 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder


@dataclass(frozen=True)
class BSARecConfig:
    n_items: int
    max_len: int = 50
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 1
    dropout: float = 0.5
    attn_dropout: float = 0.5
    alpha: float = 0.7  # weight of the frequency filter against attention
    c: int = 5  # the filter keeps c // 2 + 1 low frequencies

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.c < 1:
            raise ValueError(f"c must be >= 1, got {self.c}")


def low_pass_matrix(length: int, keep: int) -> Tensor:
    """(length, length) real matrix L with L @ x = irfft(rfft(x) with frequencies >= keep zeroed) along time."""
    spectrum = torch.fft.rfft(torch.eye(length, dtype=torch.float64), dim=0, norm="ortho")
    spectrum[keep:] = 0
    return torch.fft.irfft(spectrum, n=length, dim=0, norm="ortho").float()


class FrequencyLayer(nn.Module):
    low_pass: Tensor

    def __init__(self, config: BSARecConfig) -> None:
        super().__init__()
        self.register_buffer("low_pass", low_pass_matrix(config.max_len, config.c // 2 + 1), persistent=False)
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, config.d_model))
        self.dropout = nn.Dropout(config.dropout)
        self.norm = nn.LayerNorm(config.d_model, eps=1e-12)

    def forward(self, x: Tensor) -> Tensor:
        low = torch.matmul(self.low_pass.to(x.dtype), x)  # (T, T) @ (B, T, D)
        filtered = low + self.sqrt_beta**2 * (x - low)
        return self.norm(self.dropout(filtered) + x)


class Attention(nn.Module):
    def __init__(self, config: BSARecConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.n_heads, self.attn_dropout = config.n_heads, config.attn_dropout
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(config.dropout)
        self.norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads

        def heads(t: Tensor) -> Tensor:
            return t.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))  # bf16 under autocast
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype),
                                           dropout_p=self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, D)
        return self.norm(self.dropout(self.out(y)) + x)


class Layer(nn.Module):
    def __init__(self, config: BSARecConfig) -> None:
        super().__init__()
        self.alpha = config.alpha
        self.filter = FrequencyLayer(config)
        self.attention = Attention(config)
        dim = config.d_model
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(config.dropout))
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.alpha * self.filter(x) + (1.0 - self.alpha) * self.attention(x, mask)
        return self.ffn_norm(self.ffn(x) + x)


class BSARec(SequenceEncoder):
    causal = False  # the frequency filter mixes every position of the window
    trains_on_prefixes = True

    def __init__(self, config: BSARecConfig) -> None:
        super().__init__()
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_norm = nn.LayerNorm(config.d_model, eps=1e-12)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layers))
        self.apply(_init_weights)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, min(T, max_len), D): the states of the last max_len positions."""
        T = min(item_ids.shape[1], self.config.max_len)
        return self._run(item_ids)[:, self.config.max_len - T :]

    def encode_last(self, item_ids: Tensor) -> Tensor:
        return self._run(item_ids)[:, -1]

    def _run(self, item_ids: Tensor) -> Tensor:
        """(B, T) -> (B, max_len, D), the window left-padded (or cut) to exactly max_len items."""
        L = self.config.max_len
        ids = torch.cat([item_ids.new_zeros(item_ids.shape[0], L), item_ids], dim=1)[:, -L:]
        positions = torch.arange(L, device=ids.device)
        x = self.emb_dropout(self.emb_norm(self.item_emb(ids) + self.pos_emb(positions)))
        allowed = (ids != 0)[:, None, None, :] & (positions[None, :] <= positions[:, None])  # (B, 1, L, L)
        mask = torch.zeros(allowed.shape, device=ids.device).masked_fill(~allowed, -10_000.0)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def item_embeddings(self) -> Tensor:
        return self.item_emb.weight


def _init_weights(module: nn.Module) -> None:
    """The authors' init: normal(0, 0.02) Linear and Embedding weights (padding row included), zero biases,
    LayerNorm at (1, 0); the filter's beta keeps its standard-normal draw."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)

