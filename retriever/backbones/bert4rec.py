"""BERT4Rec (Sun et al., CIKM 2019): a bidirectional transformer trained with a cloze objective.

As in the paper: learned absolute positions added to the item embedding, LayerNorm and
dropout on the input, post-norm blocks with a GELU feed-forward (expansion 4), and a
GELU + LayerNorm head before scoring against the (shared) item table. Positions count
from the right, as in ``sasrec``, so extra left padding changes nothing.

The input table has one extra row, the mask token ``n_items + 1``; ``item_embeddings()``
leaves it out, so the mask token is never a candidate.

Training (``training_inputs``): each window keeps its last ``max_len`` items (a full
window's oldest item is also the previous window's newest, so little is lost), and then
- with probability ``last_item_prob`` a row masks only its last item: the paper's extra
  samples that look like inference (history + mask at the end);
- otherwise every real item is masked with probability ``mask_prob``; a row where that
  masked nothing masks its last item instead, so every row trains at least one position.
Masked positions are replaced by the mask token only (no BERT 80/10/10 replacement, as in
the paper), and their original ids are the targets.

Inference (``encode_last``): the history followed by the mask token, the oldest item
dropped when that would exceed ``max_len``; the user vector is the mask position's state.
``forward`` is the plain bidirectional encoder and is what training calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import attention_mask, init_module


@dataclass(frozen=True)
class BERT4RecConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.2
    mask_prob: float = 0.2
    last_item_prob: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must lie in (0, 1], got {self.mask_prob}")
        if not 0.0 <= self.last_item_prob <= 1.0:
            raise ValueError(f"last_item_prob must lie in [0, 1], got {self.last_item_prob}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2 (one item and the mask token), got {self.max_len}")


class PostNormBlock(nn.Module):
    """BERT's block: x = norm(x + attn(x)), then x = norm(x + ffn(x))."""

    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.attn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, *, last_only: bool = False) -> Tensor:
        """(B, T, D) -> (B, T, D), or (B, 1, D) for the last position alone when last_only (inference)."""
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        q, k, v = self.qkv(x).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        if last_only:
            q, mask, x = q[:, :, -1:], mask[:, :, -1:], x[:, -1:]  # (B, H, 1, hd), (B, 1, 1, T), (B, 1, D)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, q.shape[2], D)  # (B, T or 1, D)
        x = self.attn_norm(x + self.drop(self.out(y)))
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class BERT4Rec(SequenceEncoder):
    causal = False  # every position sees the whole window; the contract's causality test does not apply

    def __init__(self, config: BERT4RecConfig) -> None:
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        self.config = config
        self.mask_token = config.n_items + 1
        self.item_emb = nn.Embedding(config.n_items + 2, config.d_model, padding_idx=0)  # + the mask token
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_norm = nn.LayerNorm(config.d_model, eps=1e-12)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(PostNormBlock(config.d_model, config.n_heads, config.dropout)
                                    for _ in range(config.n_layers))
        self.head = nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.GELU(),
                                  nn.LayerNorm(config.d_model, eps=1e-12))
        self.apply(_init_weights)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids (0 = padding, n_items + 1 = mask) -> (B, T, D) hidden states; bidirectional."""
        return self._run(item_ids[:, -self.config.max_len:], last_only=False)

    def encode_last(self, item_ids: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D): the state of a mask token appended after the history."""
        mask = torch.full_like(item_ids[:, :1], self.mask_token)
        with_mask = torch.cat([item_ids[:, -(self.config.max_len - 1):], mask], dim=1)  # (B, <= max_len)
        return self._run(with_mask, last_only=True)[:, -1]

    def _run(self, item_ids: Tensor, *, last_only: bool) -> Tensor:
        T = item_ids.shape[1]
        positions = torch.arange(self.config.max_len - T, self.config.max_len, device=item_ids.device)
        x = self.emb_dropout(self.emb_norm(self.item_emb(item_ids) + self.pos_emb(positions)))  # (B, T, D)
        mask = attention_mask(item_ids, causal=False)  # padded keys masked, both directions allowed
        for i, block in enumerate(self.blocks):
            x = block(x, mask, last_only=last_only and i == len(self.blocks) - 1)
        return self.head(x)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input; the mask token's row is left out."""
        return self.item_emb.weight[: self.config.n_items + 1]

    def training_inputs(self, batch: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T + 1) windows -> (inputs, targets, trained): the cloze task (see the module docstring).

        inputs: the window with masked items replaced by the mask token; targets: the original
        ids at masked positions, 0 elsewhere; trained: (B, T') bool, the masked positions.
        """
        window = batch[:, -self.config.max_len:]  # (B, T') with T' <= max_len
        real = window != 0
        B, T = window.shape
        draw = torch.rand(B, T, generator=generator, device=window.device)
        masked = real & (draw < self.config.mask_prob)
        last_only = torch.rand(B, generator=generator, device=window.device) < self.config.last_item_prob
        last_only |= ~masked.any(1)  # rows that masked nothing train their last item
        last = torch.zeros_like(masked)
        last[:, -1] = True  # the last column is a real item in every window (left padding)
        masked = torch.where(last_only[:, None], last, masked)
        inputs = window.masked_fill(masked, self.mask_token)
        targets = window.masked_fill(~masked, 0)
        return inputs, targets, masked


def _truncated_normal(weight: Tensor) -> object:
    return nn.init.trunc_normal_(weight, std=0.02, a=-0.04, b=0.04)


def _init_weights(module: nn.Module) -> None:
    init_module(module, linear=_truncated_normal, embedding=_truncated_normal)
