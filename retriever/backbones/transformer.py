"""The "modern recsys stack" retriever of the retriever-and-ranker reference: RoPE, SwiGLU, RMSNorm,
pre-norm, causal SDPA.

Differs from SASRec in four places: rotary positions on q/k instead of a learned absolute
table, SwiGLU (expansion 4) instead of ReLU, RMSNorm instead of LayerNorm, and a final norm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import Block, RMSNorm, attention_mask, init_weights, rope_tables


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
    # Item side features (e.g. brand and categories): the mean of their embeddings is added to
    # the ID embedding on both the input and the output side. Set by training from the data.
    n_features: int = 0
    features_per_item: int = 0


class Transformer(SequenceEncoder):
    item_features: Tensor

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.feature_emb = (
            nn.Embedding(config.n_features + 1, config.d_model, padding_idx=0) if config.n_features else None
        )
        # (n_items + 1, features_per_item) feature ids, 0 = none; saved with the weights.
        self.register_buffer("item_features", torch.zeros(config.n_items + 1, config.features_per_item,
                                                          dtype=torch.long))
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.ffn_expansion) for _ in range(config.n_layers)
        )
        self.norm = RMSNorm(config.d_model)
        self.apply(init_weights)

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
        x = self.emb_dropout(self.embed(item_ids))  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, rope, last_only=last_only and i == len(self.blocks) - 1)
        return self.norm(x)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        if self.feature_emb is None:
            return self.item_emb.weight
        features = self.item_features
        counts = (features != 0).sum(1, keepdim=True).clamp(min=1)  # (n_items + 1, 1)
        side = self.feature_emb(features).sum(1) / counts  # (n_items + 1, D)
        side = side * (torch.arange(len(side), device=side.device) != 0).unsqueeze(1)  # padding stays zero
        return self.item_emb.weight + side

    def embed(self, item_ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, D) rows of ``item_embeddings()``, built for those ids only (a served
        request with item features no longer rebuilds the whole table)."""
        if self.feature_emb is None:
            return self.item_emb(item_ids)
        features = self.item_features[item_ids]  # (B, T, F)
        counts = (features != 0).sum(-1, keepdim=True).clamp(min=1)
        side = self.feature_emb(features).sum(-2) / counts
        return self.item_emb(item_ids) + side * (item_ids != 0).unsqueeze(-1)

    def borrowed_id_rows(self, features: Tensor) -> Tensor:
        """(M, F) feature ids -> (M, D): for each item, the mean over its feature values of the mean ID row of this
        encoder's items that have that value (as the feature part is the mean of its values' embeddings); zero
        for an item none of whose values any of them has. Call it on the trained model, not one items were
        added to, so that the rows do not depend on the order of the additions."""
        if self.feature_emb is None:
            return super().borrowed_id_rows(features)
        held, rows = self.item_features[1:], self.item_emb.weight[1:].detach()
        n_values = self.config.n_features + 1
        sums = rows.new_zeros(n_values, rows.shape[1])
        counts = rows.new_zeros(n_values)
        for column in held.T:  # one feature slot at a time: (n_items,) value ids, 0 = none
            sums.index_add_(0, column, rows)
            counts.index_add_(0, column, torch.ones_like(column, dtype=rows.dtype))
        sums[0], counts[0] = 0, 0  # "no value" borrows nothing
        means = sums / counts.clamp(min=1).unsqueeze(1)  # (n_values, D)
        known = (counts[features] > 0).to(rows.dtype)  # (M, F)
        total = (means[features] * known.unsqueeze(-1)).sum(1)
        return total / known.sum(1, keepdim=True).clamp(min=1)

    def set_item_features(self, features: Tensor) -> None:
        """features: (n_items + 1, features_per_item) ids in [0, n_features], 0 = none."""
        expected = tuple(self.item_features.shape)
        if tuple(features.shape) != expected:
            raise ValueError(f"item features must be shaped {expected}, got {tuple(features.shape)}")
        if len(features) and (int(features.min()) < 0 or int(features.max()) > self.config.n_features):
            raise ValueError(f"feature ids must lie in [0, {self.config.n_features}]")
        self.item_features.copy_(features)

    def add_items(self, features: Tensor, id_rows: Tensor | None = None) -> None:
        """Append (M, F) new items by their feature ids, with (M, D) ``id_rows`` as their ID part (the catalogue
        passes a weight times `borrowed_id_rows` of the trained model); None leaves it zero, so each is the mean
        of its feature embeddings alone, which sits closer to every user than a trained item does
        (docs/results/cold-calibration)."""
        if self.feature_emb is None:
            super().add_items(features)
        width = self.item_features.shape[1]
        if features.ndim != 2 or features.shape[1] != width:
            raise ValueError(f"new item features must be shaped (M, {width}), got {tuple(features.shape)}")
        if len(features) and (int(features.min()) < 0 or int(features.max()) > self.config.n_features):
            raise ValueError(f"feature ids must lie in [0, {self.config.n_features}]")
        old = self.item_emb.weight
        if id_rows is not None and tuple(id_rows.shape) != (len(features), old.shape[1]):
            raise ValueError(f"new ID rows must be shaped ({len(features)}, {old.shape[1]}), "
                             f"got {tuple(id_rows.shape)}")
        table = nn.Embedding(len(old) + len(features), old.shape[1], padding_idx=0).to(old.device, old.dtype)
        with torch.no_grad():
            table.weight[: len(old)] = old
            table.weight[len(old) :] = 0 if id_rows is None else id_rows.to(old)
        self.item_emb = table
        self.item_features = torch.cat([self.item_features, features.to(self.item_features)])
        self.config = replace(self.config, n_items=self.config.n_items + len(features))
