"""LightSANs (Fan et al., SIGIR 2021): low-rank decomposed self-attention, decoupled positions.

Each layer mixes two attentions and adds them (post-norm blocks, GELU feed-forward, as in
the paper and RecBole's implementation):

- **Item-to-interest.** The T keys and the T values are aggregated into ``k_interests``
  latent interests (k << T) with a learned (D, k) matrix Theta: weights
  softmax over positions of ``key_s @ Theta``, and an interest is the weighted sum of the
  keys (values) over positions. Each query attends to the k interests (softmax over k).
- **Decoupled positions.** Position-to-position attention computed from the learned
  position table alone (its own LayerNorm and q/k projections), applied to the values,
  and added to the item term; positions are never added to the item embeddings. As in
  the paper this term is T x T, but it depends on positions only, not on the items.

**Causality.** The paper scores only the last position, so it aggregates interests over
the whole sequence. Every position is trained here, so the interests seen by the query
at position t are aggregated over positions s <= t only, with a *causal cumulative
softmax*: ``interest_t = sum_{s<=t} exp(a_s) v_s / sum_{s<=t} exp(a_s)``, computed with
two cumulative sums over positions (O(T k D), keeping the "lighter" cost; the paper's
version is the t = T case). Padding positions get weight 0. A cumulative sum cannot
subtract a running maximum (the usual softmax guard), and subtracting the maximum over
the whole window would take a reference value from later positions, so the aggregation
scores are clamped to [-40, 40] instead: exp stays inside float32 for any input, scores
in that range (all but pathological ones) get the exact softmax, and nothing leaks from
the future. The position attention is masked causally and on padded keys like any
self-attention.

Positions count from the right, as in ``sasrec``, so extra left padding changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import attention_mask, init_weights_padding_idx

SCORE_LIMIT = 40.0  # exp(40) * max_len * |value| stays far below the float32 limit (3.4e38)


@dataclass(frozen=True)
class LightSANsConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    k_interests: int = 5
    dropout: float = 0.2


def causal_interests(x: Tensor, scores: Tensor, real: Tensor) -> Tensor:
    """Per-prefix interests: (B, T, D) rows, (B, T, k) raw scores, (B, T) real -> (B, T, k, D).

    Out[:, t, j] is the softmax(scores[:, :t+1, j])-weighted mean of x[:, :t+1] over real positions.
    """
    x, scores = x.float(), scores.float()  # the sums below need float32 range and precision under autocast
    weights = torch.exp(scores.clamp(-SCORE_LIMIT, SCORE_LIMIT)) * real.unsqueeze(-1)  # (B, T, k)
    numerator = torch.cumsum(weights.unsqueeze(-1) * x.unsqueeze(2), dim=1)  # (B, T, k, D)
    denominator = torch.cumsum(weights, dim=1).unsqueeze(-1)  # (B, T, k, 1)
    return numerator / denominator.clamp_min(torch.finfo(torch.float32).tiny)  # all-padding prefixes: 0


class LightAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, k_interests: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.key_theta = nn.Parameter(torch.randn(dim, k_interests) / dim**0.5)  # item-to-interest aggregation
        self.value_theta = nn.Parameter(torch.randn(dim, k_interests) / dim**0.5)
        self.pos_norm = nn.LayerNorm(dim, eps=1e-12)
        self.pos_qk = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor, real: Tensor) -> Tensor:
        """x (B, T, D), pos (T, D) position embeddings, mask (B, 1, T, T), real (B, T) -> (B, T, D)."""
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, T, D)
        key_interests = causal_interests(k, k @ self.key_theta, real).to(x.dtype)  # (B, T, k, D)
        value_interests = causal_interests(v, v @ self.value_theta, real).to(x.dtype)
        n_interests = key_interests.shape[2]
        q_heads = q.view(B, T, H, hd)  # (B, T, H, hd)
        key_interests = key_interests.view(B, T, n_interests, H, hd)
        value_interests = value_interests.view(B, T, n_interests, H, hd)
        interest_scores = torch.einsum("bthd,btkhd->bthk", q_heads, key_interests) / hd**0.5  # (B, T, H, k)
        interest_probs = self.attn_drop(interest_scores.softmax(dim=-1))
        item_term = torch.einsum("bthk,btkhd->bthd", interest_probs, value_interests).reshape(B, T, D)

        pos_q, pos_k = self.pos_qk(self.pos_norm(pos)).view(T, 2, H, hd).permute(1, 2, 0, 3).unbind(0)  # (H, T, hd)
        v_heads = v.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        pos_term = F.scaled_dot_product_attention(
            pos_q.expand(B, H, T, hd), pos_k.expand(B, H, T, hd), v_heads, attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
        )  # (B, H, T, hd)
        return self.out(item_term + pos_term.transpose(1, 2).reshape(B, T, D))


class LightBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, k_interests: int, dropout: float) -> None:
        super().__init__()
        self.attn = LightAttention(dim, n_heads, k_interests, dropout)
        self.attn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor, real: Tensor) -> Tensor:
        x = self.attn_norm(x + self.drop(self.attn(x, pos, mask, real)))
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class LightSANs(SequenceEncoder):
    def __init__(self, config: LightSANsConfig) -> None:
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        if config.k_interests < 1:
            raise ValueError(f"k_interests must be >= 1, got {config.k_interests}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_norm = nn.LayerNorm(config.d_model, eps=1e-12)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(LightBlock(config.d_model, config.n_heads, config.k_interests, config.dropout)
                                    for _ in range(config.n_layers))
        self.apply(init_weights_padding_idx)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states; causal."""
        max_len = self.config.max_len
        item_ids = item_ids[:, -max_len:]
        T = item_ids.shape[1]
        pos = self.pos_emb(torch.arange(max_len - T, max_len, device=item_ids.device))  # (T, D)
        real = item_ids != 0
        mask = attention_mask(item_ids, causal=True)
        x = self.emb_dropout(self.emb_norm(self.item_emb(item_ids)))  # (B, T, D); positions enter each layer
        for block in self.blocks:
            x = block(x, pos, mask, real)
        return x

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight
