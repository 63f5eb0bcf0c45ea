"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"), the base of PCRec (KDD 2025).

Per layer, as in the paper and its reference code (``generative-recommenders``):

    U, V, Q, K = split(SiLU(f1(LayerNorm(x))))
    A = SiLU(Q K^T + rab) / n                    pointwise, no softmax; causal, padded keys 0
    x = x + f2(dropout(LayerNorm(A V) * U))

with multiple heads (Q, K, V, U split per head), parameter-free LayerNorms (as the
reference code) and n = ``max_len``: the reference code divides by the padded length,
which is ``max_len`` there because every sequence is padded to it; a fixed n keeps the
output independent of how far a batch is padded. The input is the item embedding
times sqrt(D) plus a learned absolute position (counted from the right, as in ``sasrec``,
so extra left padding changes nothing), with dropout.

**Relative attention bias.** ``rab`` = a learned bias per head and bucketed relative
distance i - j (exact below ``n_pos_buckets // 2``, logarithmic up to ``max_len``), plus,
when ``forward`` is given ``timestamps``, a learned bias per head and bucket of the time
gap ``ts_i - ts_j`` (bucket ``floor(ln(max(gap, 1)) / 0.301)``, as the reference code,
capped at ``n_time_buckets``; 0 turns the time bias off). The query's own timestamp is
used, never the target's: the reference code compares key times with the *next* item's
time, which at serving time is the time of the request being answered; here the target
is the next item, and its time is not an input. The training and evaluation data path
passes item ids only, so the time bias is not trained yet; the position bias always is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import init_module

TIME_BUCKET_WIDTH = 0.301  # ln-gap per bucket, from the reference code


@dataclass(frozen=True)
class HSTUConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 1
    dropout: float = 0.2
    attn_dropout: float = 0.0
    n_pos_buckets: int = 32
    n_time_buckets: int = 128


def position_buckets(distance: Tensor, n_buckets: int, max_distance: int) -> Tensor:
    """Non-negative integer distances -> bucket ids in [0, n_buckets): exact, then log-spaced (T5)."""
    exact = max(1, n_buckets // 2)
    if exact >= n_buckets or max_distance <= exact:
        return distance.clamp(max=n_buckets - 1)
    log_ratio = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (n_buckets - exact)).long()
    return torch.where(distance < exact, distance, far.clamp(max=n_buckets - 1))


def time_buckets(gap: Tensor, n_buckets: int) -> Tensor:
    """Time gaps (any unit, e.g. seconds) -> bucket ids in [0, n_buckets]."""
    return (torch.log(gap.abs().float().clamp(min=1)) / TIME_BUCKET_WIDTH).long().clamp(0, n_buckets)


class HSTULayer(nn.Module):
    def __init__(self, config: HSTUConfig) -> None:
        super().__init__()
        D, H = config.d_model, config.n_heads
        self.n_heads = H
        self.norm_shape = (D,)  # a constant rather than x.shape[-1:]: the ONNX trace then needs no shape arithmetic
        self.norm_scale = float(config.max_len)
        self.f1 = nn.Linear(D, 4 * D)
        self.f2 = nn.Linear(D, D)
        self.pos_bias = nn.Embedding(config.n_pos_buckets, H)
        self.time_bias = nn.Embedding(config.n_time_buckets + 1, H) if config.n_time_buckets else None
        self.drop = nn.Dropout(config.dropout)
        self.attn_drop = nn.Dropout(config.attn_dropout)
        self.n_pos_buckets = config.n_pos_buckets
        self.max_len = config.max_len

    def forward(self, x: Tensor, keep: Tensor, distance: Tensor, time_gap: Tensor | None) -> Tensor:
        """x (B, T, D); keep (B, 1, T, T) 0/1 causal and padding mask; distance (T, T) = i - j;
        time_gap (B, T, T) = ts_i - ts_j or None -> (B, T, D)."""
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        normed = F.layer_norm(x.float(), self.norm_shape).to(x.dtype)
        u, v, q, k = F.silu(self.f1(normed)).chunk(4, dim=-1)  # each (B, T, D)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))  # each (B, H, T, hd)
        rab = self.pos_bias(position_buckets(distance.clamp(min=0), self.n_pos_buckets, self.max_len))  # (T, T, H)
        scores = q @ k.transpose(-1, -2) + rab.permute(2, 0, 1)  # (B, H, T, T)
        if time_gap is not None and self.time_bias is not None:
            scores = scores + self.time_bias(time_buckets(time_gap, self.time_bias.num_embeddings - 1)).permute(
                0, 3, 1, 2)  # (B, H, T, T)
        attn = self.attn_drop(F.silu(scores) / self.norm_scale * keep)
        y = (attn @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        y = F.layer_norm(y.float(), self.norm_shape).to(x.dtype)
        return x + self.f2(self.drop(y * u))


class HSTU(SequenceEncoder):
    def __init__(self, config: HSTUConfig) -> None:
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        if config.n_pos_buckets < 1 or config.n_time_buckets < 0:
            raise ValueError("n_pos_buckets must be >= 1 and n_time_buckets >= 0")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(HSTULayer(config) for _ in range(config.n_layers))
        self.apply(_init_weights)

    def forward(self, item_ids: Tensor, timestamps: Tensor | None = None) -> Tensor:
        """(B, T) item ids, 0 = padding; optional (B, T) timestamps of those items -> (B, T, D); causal."""
        max_len = self.config.max_len
        item_ids = item_ids[:, -max_len:]
        T = item_ids.shape[1]
        device = item_ids.device
        real = item_ids != 0
        positions = torch.arange(max_len - T, max_len, device=device)
        x = self.item_emb(item_ids) * self.config.d_model**0.5 + self.pos_emb(positions)  # (B, T, D)
        x = self.emb_dropout(x) * real.unsqueeze(-1)
        index = torch.arange(T, device=device)
        distance = index[:, None] - index[None, :]  # (T, T) i - j
        keep = ((distance >= 0)[None] & real[:, None, :]).unsqueeze(1).to(x.dtype)  # (B, 1, T, T)
        time_gap = None
        if timestamps is not None:
            timestamps = timestamps[:, -max_len:]
            time_gap = timestamps[:, :, None] - timestamps[:, None, :]  # (B, T, T) ts_i - ts_j, >= 0 where kept
        for layer in self.layers:
            x = layer(x, keep, distance, time_gap)
        return x

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight


def _init_weights(module: nn.Module) -> None:
    init_module(module, linear=nn.init.xavier_uniform_)
