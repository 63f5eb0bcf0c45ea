"""MLP ranker with ID dropout (the second stage of the retriever-and-ranker reference).

Inputs per candidate: the dense features (standardised with statistics fixed at training
time), the ranker's own item-ID embedding, its product with a projection of the user
vector, the mean of the candidate's metadata embeddings, a year-bucket embedding, the
retriever user vector and the element-wise product of user and candidate vectors.

An unknown candidate (``is_unknown`` feature set: never seen in training, or masked)
gets a learned "unknown" vector instead of its ID embedding. During training each
candidate is masked with probability ``id_dropout``, so the ranker learns to score items
from metadata and popularity alone; scoring with every ID masked is the cold-start
simulation.

An ensemble (``members`` > 1) is this network plus ``members - 1`` others trained alone from
other random seeds (`ranker.train.fit_mlp_ensemble`); it scores with the mean of their logits,
one module, so it is saved, compiled and served as one ranker. A single member's weights keep
the names they always had.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from common.atomic import atomic_torch_save
from ranker.config import MLPConfig
from ranker.features import DENSE_FEATURES, FeatureBatch

WEIGHTS = "mlp.pt"


class MLPRanker(nn.Module):
    kind: ClassVar[str] = "mlp"
    dense_mean: Tensor
    dense_std: Tensor

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        n_dense = len(DENSE_FEATURES) + len(config.extra_features)
        self.id_emb = nn.Embedding(config.n_items + 1, config.id_dim)
        self.unknown = nn.Parameter(torch.zeros(config.id_dim))
        self.meta_emb = nn.Embedding(config.n_meta + 1, config.meta_dim, padding_idx=0)
        self.year_emb = nn.Embedding(config.n_year_buckets + 1, config.year_dim)
        self.user_proj = nn.Linear(config.dim, config.id_dim)
        self.register_buffer("dense_mean", torch.zeros(n_dense))
        self.register_buffer("dense_std", torch.ones(n_dense))
        width = n_dense + 2 * config.id_dim + config.meta_dim + config.year_dim + 2 * config.dim
        layers: list[nn.Module] = []
        for size in config.hidden:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(config.dropout)]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        nn.init.normal_(self.id_emb.weight, std=0.02)
        nn.init.normal_(self.meta_emb.weight, std=0.02)
        nn.init.normal_(self.year_emb.weight, std=0.02)
        one = replace(config, members=1)
        self.others = nn.ModuleList(MLPRanker(replace(one, seed=config.seed + i)) for i in range(1, config.members))

    @classmethod
    def ensemble(cls, members: list[MLPRanker]) -> MLPRanker:
        """One ranker scoring with the mean logits of trained single-member rankers (their scaling included)."""
        first = members[0].config
        if any(m.config.members != 1 or replace(m.config, seed=first.seed) != first for m in members):
            raise ValueError("ensemble members must be single rankers of one shape")
        model = cls(replace(first, members=len(members)))
        state = dict(members[0].state_dict())
        for i, member in enumerate(members[1:]):
            state.update({f"others.{i}.{k}": v for k, v in member.state_dict().items()})
        model.load_state_dict(state)
        return model.eval()

    def set_scaling(self, mean: Tensor, std: Tensor) -> None:
        self.dense_mean.copy_(mean)
        self.dense_std.copy_(std)

    def forward(self, batch: FeatureBatch) -> Tensor:
        """(B, N) logits (an ensemble's mean); empty candidate slots get -inf."""
        members = [self, *cast(list[MLPRanker], list(self.others))]
        logits = torch.stack([m.logits(batch) for m in members]).mean(0) if len(members) > 1 else self.logits(batch)
        return logits.masked_fill(~batch.valid, -torch.inf)

    def logits(self, batch: FeatureBatch) -> Tensor:
        """(B, N) this member's logits, empty slots not masked."""
        dense = (batch.dense - self.dense_mean) / self.dense_std  # (B, N, F)
        # ids past the trained table are items added since (service/system/catalog.py): unknown, replaced below
        ids = self.id_emb(batch.candidates.clamp(max=self.id_emb.num_embeddings - 1))  # (B, N, id_dim)
        ids = torch.where(batch.unknown[..., None], self.unknown.expand_as(ids), ids)
        user = batch.user[:, None, :].expand(-1, ids.shape[1], -1)  # (B, N, D)
        meta_ids = batch.meta
        meta = self.meta_emb(meta_ids).sum(-2) / (meta_ids != 0).sum(-1, keepdim=True).clamp(min=1)  # mean
        x = torch.cat([dense, ids, ids * self.user_proj(batch.user)[:, None, :], meta,
                       self.year_emb(batch.year_bucket), user, batch.product], dim=-1)
        return self.mlp(x).squeeze(-1)  # (B, N)

    def score(self, batch: FeatureBatch) -> Tensor:
        self.eval()
        with torch.inference_mode():
            return self(batch)

    def save(self, folder: Path) -> dict[str, Any]:
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        atomic_torch_save(state, folder / WEIGHTS)
        return {"files": [WEIGHTS], "config": asdict(self.config)}

    @classmethod
    def load(cls, folder: Path, config: dict[str, Any]) -> MLPRanker:
        """config: what `save` returned under "config" (the manifest keeps it)."""
        raw = dict(config)
        raw["hidden"] = tuple(raw["hidden"])
        raw["extra_features"] = tuple(raw.get("extra_features", ()))
        model = cls(MLPConfig(**raw))
        model.load_state_dict(torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True))
        return model.eval()


def group_loss(logits: Tensor, labels: Tensor, valid: Tensor, kind: str) -> Tensor:
    """Loss over each group's candidates. labels: (B,) position of the positive (every group has one)."""
    if kind == "listwise":
        return nn.functional.cross_entropy(logits, labels)
    if kind == "bce":
        target = torch.zeros_like(logits)
        target[torch.arange(len(labels)), labels] = 1.0
        loss = nn.functional.binary_cross_entropy_with_logits(logits.masked_fill(~valid, 0.0), target,
                                                              reduction="none")
        return (loss * valid).sum() / valid.sum()
    raise ValueError(f"unknown ranker loss {kind!r}; expected 'listwise' or 'bce'")
