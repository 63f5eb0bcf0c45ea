"""Ranker features: one function that the offline trainer and the online service both call.

A request (or a mined training example) is a history, the retriever's top-N candidates
with their scores, and the user vector. `compute_features` turns a batch of them into a
`FeatureBatch`: dense per-candidate columns (the LightGBM ranker uses only these) plus the
ids, metadata and vectors that the MLP ranker embeds.

An item whose ID embedding cannot be trusted (never seen in training, or masked for ID
dropout and the cold-start simulation) gets ``is_unknown = 1`` and every column derived
from the retriever's ID-trained vectors set to 0, so the rankers learn to fall back on
metadata and popularity for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ranker.groups import Extras, Inputs, base_columns, base_groups, group_of, iter_base
from ranker.tables import PAIR_WINDOW, RECENT, YEAR_BUCKET, ItemTables, TorchTables

DENSE_FEATURES = base_columns()  # every ranker's columns, from the base groups (`ranker.groups`), in order
COLUMN = {name: i for i, name in enumerate(DENSE_FEATURES)}
# Columns computed from the retriever's ID-trained vectors or from the item's own interaction
# history: not trusted (zeroed) for unknown items.
ID_DERIVED = tuple(COLUMN[n] for g in base_groups() for n in g.id_derived)


@dataclass(frozen=True)
class FeatureBatch:
    dense: Tensor  # (B, N, len(DENSE_FEATURES)) float32
    candidates: Tensor  # (B, N) internal ids, 0 = empty slot
    meta: Tensor  # (B, N, M) metadata value ids of the candidates
    year_bucket: Tensor  # (B, N)
    user: Tensor  # (B, D) retriever user vector
    product: Tensor  # (B, N, D) user vector * candidate vector, 0 for unknown candidates

    @property
    def unknown(self) -> Tensor:
        return self.dense[..., COLUMN["is_unknown"]] > 0.5

    @property
    def valid(self) -> Tensor:
        return self.candidates != 0


def compute_features(
    tables: TorchTables,
    item_vectors: Tensor,
    history: Tensor,
    user: Tensor,
    candidates: Tensor,
    scores: Tensor,
    *,
    id_mask: Tensor | None = None,
    extras: Extras | None = None,
    at: Tensor | None = None,
    last_event: Tensor | None = None,
) -> FeatureBatch:
    """Features for (B, N) candidates of B requests.

    item_vectors: (n_items + 1, D) unit retriever item vectors; history: (B, T) left-padded
    internal ids (the items the user vector was computed from); user: (B, D) unit user
    vectors; candidates: (B, N) internal ids (0 = empty slot), best first; scores: (B, N)
    their cosine scores. id_mask: (B, N) True where the candidate's ID must be treated as
    unknown (ID dropout in training, the cold-start simulation in evaluation). at: (B,) each request's time
    in seconds, and last_event: (B,) the time of each user's newest interaction (NaN: unknown), read by the
    request-time extras (`ranker.groups.request_time`) only.

    The arithmetic is numpy on CPU arrays (the tensors' memory, no copies): a served request is one user
    and a few hundred candidates, where torch's per-operation dispatch cost more than the arithmetic
    (docs/results/serve/). Offline groups of thousands of users run the same code.
    """
    cand = candidates.numpy()
    valid = cand != 0
    unknown = ~tables.arrays.known[cand] | ~valid | (id_mask.numpy() if id_mask is not None else False)
    runtime = {} if extras is None else dict(extras.tables or {})
    x = Inputs(history.numpy(), cand, unknown, history, candidates, torch.from_numpy(unknown), runtime, tables.arrays,
               item_vectors.numpy(), scores.numpy(), at, last_event)
    b, n = cand.shape
    dense = np.empty((b, n, len(DENSE_FEATURES)), dtype=np.float32)
    for name, values in iter_base(x):
        dense[..., COLUMN[name]] = values
    dense[..., ID_DERIVED] = np.where(unknown[..., None], np.float32(0), dense[..., ID_DERIVED])
    out = torch.from_numpy(dense)
    if extras is not None and extras.names:
        out = torch.cat([out, optional_columns(extras.names, x)], dim=-1)
    out = out * torch.from_numpy(valid[..., None])
    product = torch.from_numpy(np.where(unknown[..., None], np.float32(0),
                                        user.numpy()[:, None, :] * x.candidate_vectors))
    return FeatureBatch(out, candidates, torch.from_numpy(x.meta), torch.from_numpy(tables.arrays.year_bucket[cand]),
                        user, product)


def optional_columns(names: tuple[str, ...], x: Inputs) -> Tensor:
    """(B, N, len(names)) float32: the optional columns ``names`` in order, each group computed once (in float64
    where it can, rounded once here, so a user's value does not depend on the batch); a group's ID-derived
    columns are 0 for an unknown candidate."""
    computed: dict[str, Any] = {}
    masked = []
    for i, name in enumerate(names):
        group = group_of(name)
        if name not in computed:
            computed.update(group.compute(x))
        if name in group.id_derived:
            masked.append(i)
    out = torch.stack([torch.as_tensor(computed[name]).float() for name in names], dim=-1)
    out[..., masked] = out[..., masked].masked_fill(x.unknown_t[..., None], 0.0)
    return out


def extra_columns(extras: Extras, history: Tensor, candidates: Tensor, unknown: Tensor, at: Tensor | None = None,
                  last_event: Tensor | None = None) -> Tensor:
    """`optional_columns` without the item tables (the groups that read only their own tables: co-occurrence,
    request times), for (B, T) left-padded histories and (B, N) candidates with their (B, N) unknown flags."""
    x = Inputs(history.numpy(), candidates.numpy(), unknown.numpy(), history, candidates, unknown,
               dict(extras.tables or {}), at=at, last_event=last_event)
    return optional_columns(extras.names, x)


def standardize_stats(dense: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Per-column mean and std over valid candidate slots (for the MLP's fixed input scaling).

    A column constant over the sample keeps scale 1 (only its mean is taken off): dividing by a
    near-zero std would turn any later value of it (an unknown item's flag) into a huge input.
    """
    rows = dense[valid]
    mean = rows.mean(0)
    std = rows.std(0)
    return mean, torch.where(std > 1e-6, std, torch.ones_like(std))


def feature_spec(tables: ItemTables, dim: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a ranker was trained on, stored with it and checked at load."""
    return {"dense": [*DENSE_FEATURES, *extra], "id_derived": [DENSE_FEATURES[i] for i in ID_DERIVED],
            "n_items": tables.n_items, "n_meta": tables.n_meta, "n_year_buckets": tables.n_year_buckets,
            "meta_width": int(tables.meta.shape[1]), "dim": dim, "recent": RECENT, "year_bucket_years": YEAR_BUCKET,
            "pair_window": PAIR_WINDOW}


def unit(x: Tensor) -> Tensor:
    return F.normalize(x.float(), dim=-1)
