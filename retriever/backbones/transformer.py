"""The "modern recsys stack" retriever of seed 002: RoPE, SwiGLU, RMSNorm, pre-norm, causal SDPA.

Differs from SASRec in four places: rotary positions on q/k instead of a learned absolute
table, SwiGLU (expansion 4) instead of ReLU, RMSNorm instead of LayerNorm, and a final norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from retriever.layers import Block, RMSNorm, attention_mask, rope_tables


@dataclass(frozen=True)
class TransformerConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    dropout: float = 0.1
    emb_dropout: float = 0.1
    ffn_expansion: float = 4.0
    rope_base: float = 10_000.0


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.ffn_expansion) for _ in range(config.n_layers)
        )
        self.norm = RMSNorm(config.d_model)
        self.apply(_init_weights)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states."""
        return self._run(item_ids, last_only=False)

    def encode_last(self, item_ids: Tensor) -> Tensor:
        """(B, T) -> (B, D): the last position only; the final block skips the other positions' queries."""
        return self._run(item_ids, last_only=True)[:, -1]

    def _run(self, item_ids: Tensor, *, last_only: bool) -> Tensor:
        T = item_ids.shape[1]
        head_dim = self.config.d_model // self.config.n_heads
        rope = rope_tables(T, head_dim, base=self.config.rope_base, device=item_ids.device)
        mask = attention_mask(item_ids, causal=True)
        x = self.emb_dropout(self.item_emb(item_ids))  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, rope, last_only=last_only and i == len(self.blocks) - 1)
        return self.norm(x)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
        with torch.no_grad():
            module.weight[0].zero_()
