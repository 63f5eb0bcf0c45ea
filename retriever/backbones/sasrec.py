"""SASRec (Kang & McAuley 2018): learned absolute positions, LayerNorm, ReLU feed-forward.

Trained with ``loss.name=bce`` and ``model.similarity=dot`` it is the original; with
``loss.name=full`` it is SASRec+ (Klenitskiy & Vasilev 2023). Positions count from the
right (the last item always gets position max_len - 1), matching the original's left
padding whatever width a batch is trimmed to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import attention_mask


@dataclass(frozen=True)
class SASRecConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 1
    dropout: float = 0.2
    emb_dropout: float = 0.2


class SASRecBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.attn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn_norm = nn.LayerNorm(dim, eps=1e-8)
        self.ffn = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        normed = self.attn_norm(x)  # the original normalises only the queries and keeps them as the residual
        q = self.q(normed).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k, v = self.kv(x).view(B, T, 2, H, hd).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        x = normed + self.drop(self.out(y.transpose(1, 2).reshape(B, T, D)))
        normed = self.ffn_norm(x)
        return normed + self.drop(self.ffn(normed))


class SASRec(SequenceEncoder):
    def __init__(self, config: SASRecConfig) -> None:
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(SASRecBlock(config.d_model, config.n_heads, config.dropout)
                                    for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=1e-8)
        for name, p in self.named_parameters():
            if p.ndim >= 2 and "norm" not in name:
                nn.init.xavier_normal_(p)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states."""
        max_len = self.config.max_len
        item_ids = item_ids[:, -max_len:]
        positions = torch.arange(max_len - item_ids.shape[1], max_len, device=item_ids.device)
        x = self.item_emb(item_ids) * self.config.d_model**0.5 + self.pos_emb(positions)  # (B, T, D)
        x = self.emb_dropout(x) * (item_ids != 0).unsqueeze(-1)
        mask = attention_mask(item_ids, causal=True)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)

    def item_embeddings(self) -> Tensor:
        return self.item_emb.weight
