"""The ranker's item tables: per-item statistics from training positions (popularity, known flags, the
item-to-item "follows" counts) and catalogue metadata (value ids, year buckets), saved beside the ranker as
``item_tables.npz`` and read by the feature groups (`ranker.feature_groups`) as numpy arrays.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

PAIR_WINDOW = 3  # b "follows" a when it comes 1..PAIR_WINDOW positions after a in a training sequence
YEAR_BUCKET = 5  # years per bucket
RECENT = 5  # "recent" history items of the similarity and follows features
TABLES_FILE = "item_tables.npz"


@dataclass(frozen=True)
class ItemTables:
    """Per-item inputs of the ranker, indexed by internal id (row 0 = padding).

    popularity, known and the item-to-item "follows" counts come from training positions
    only; meta and years are catalogue metadata. Saved beside the ranker (``numpy.savez``,
    loaded with ``allow_pickle=False``).
    """

    popularity: np.ndarray  # (n_items + 1,) float32 in [0, 1]
    known: np.ndarray  # (n_items + 1,) bool: the item occurs in training positions
    meta: np.ndarray  # (n_items + 1, M) int64 metadata value ids, 0 = none
    year_bucket: np.ndarray  # (n_items + 1,) int64, 0 = unknown
    pair_keys: np.ndarray  # (P,) sorted int64 a * (n_items + 1) + b for every pair "b follows a"
    pair_counts: np.ndarray  # (P,) float32 how often
    follow_totals: np.ndarray  # (n_items + 1,) float32 pairs that start at each item
    n_meta: int
    n_year_buckets: int

    @property
    def n_items(self) -> int:
        return len(self.popularity) - 1

    @classmethod
    def build(cls, train_offsets: np.ndarray, train_items: np.ndarray, n_items: int, meta: np.ndarray | None = None,
              years: np.ndarray | None = None) -> ItemTables:
        """train_offsets/items: CSR training positions (no validation or test target)."""
        keys, pair_counts = _follow_pairs(train_offsets, train_items, n_items)
        totals = np.bincount(keys // (n_items + 1), weights=pair_counts, minlength=n_items + 1).astype(np.float32)
        counts = np.bincount(train_items, minlength=n_items + 1)[: n_items + 1].astype(np.float64)
        counts[0] = 0
        popularity = (np.log1p(counts) / max(np.log1p(counts.max()), 1e-9)).astype(np.float32)
        meta = np.zeros((n_items + 1, 1), dtype=np.int64) if meta is None else np.asarray(meta, dtype=np.int64)
        buckets = np.zeros(n_items + 1, dtype=np.int64)
        if years is not None:
            years = np.asarray(years, dtype=np.float64)
            ok = np.isfinite(years) & (years > 0)
            if ok.any():
                first = years[ok].min()
                buckets[ok] = ((years[ok] - first) // YEAR_BUCKET).astype(np.int64) + 1
        return cls(popularity, counts > 0, meta, buckets, keys, pair_counts, totals, int(meta.max()),
                   int(buckets.max()))

    def save(self, path: Path) -> None:
        with path.open("wb") as handle:
            np.savez(handle, popularity=self.popularity, known=self.known, meta=self.meta,
                     year_bucket=self.year_bucket, pair_keys=self.pair_keys, pair_counts=self.pair_counts,
                     follow_totals=self.follow_totals)

    @classmethod
    def load(cls, path: Path) -> ItemTables:
        with np.load(path, allow_pickle=False) as z:
            meta, buckets = z["meta"], z["year_bucket"]
            return cls(z["popularity"], z["known"], meta, buckets, z["pair_keys"], z["pair_counts"],
                       z["follow_totals"], int(meta.max()), int(buckets.max()))

    def torch(self, device: torch.device | str = "cpu") -> TorchTables:
        return TorchTables(
            popularity=torch.from_numpy(self.popularity).to(device),
            known=torch.from_numpy(self.known).to(device),
            meta=torch.from_numpy(self.meta).to(device),
            year_bucket=torch.from_numpy(self.year_bucket).to(device),
            pair_keys=torch.from_numpy(self.pair_keys).to(device),
            pair_counts=torch.from_numpy(self.pair_counts).to(device),
            follow_totals=torch.from_numpy(self.follow_totals).to(device),
            n_meta=self.n_meta,
        )


def _follow_pairs(offsets: np.ndarray, items: np.ndarray, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys a * (n_items + 1) + b and counts of "b within PAIR_WINDOW steps after a"."""
    position = np.arange(len(items)) - np.repeat(offsets[:-1], np.diff(offsets))  # index inside the user's row
    keys = []
    for lag in range(1, PAIR_WINDOW + 1):
        same_user = position[lag:] >= lag
        keys.append(items[:-lag][same_user] * (n_items + 1) + items[lag:][same_user])
    flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    unique, counts = np.unique(flat.astype(np.int64), return_counts=True)
    return unique, counts.astype(np.float32)


@dataclass(frozen=True)
class TableArrays:
    """`TorchTables` as numpy arrays sharing the tensors' memory: what `compute_features` reads."""

    popularity: np.ndarray
    known: np.ndarray
    meta: np.ndarray
    year_bucket: np.ndarray
    pair_keys: np.ndarray
    pair_counts: np.ndarray
    follow_totals: np.ndarray
    n_meta: int

    def follows(self, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        """How often ``target`` followed ``source`` in training, float32, broadcast elementwise; 0 for padding."""
        source, target = np.broadcast_arrays(source, target)
        keys = (source * len(self.popularity) + target).reshape(-1)
        if len(self.pair_keys) == 0:
            return np.zeros(source.shape, dtype=np.float32)
        pos = np.minimum(np.searchsorted(self.pair_keys, keys), len(self.pair_keys) - 1)
        hit = (self.pair_keys[pos] == keys) & (source != 0).reshape(-1) & (target != 0).reshape(-1)
        return np.where(hit, self.pair_counts[pos], np.float32(0)).reshape(source.shape)


@dataclass(frozen=True)
class TorchTables:
    popularity: Tensor
    known: Tensor
    meta: Tensor
    year_bucket: Tensor
    pair_keys: Tensor
    pair_counts: Tensor
    follow_totals: Tensor
    n_meta: int

    @functools.cached_property
    def arrays(self) -> TableArrays:
        """The same tables as numpy arrays (CPU tensors' memory, no copy), made once per tables object."""
        return TableArrays(self.popularity.numpy(), self.known.numpy(), self.meta.numpy(), self.year_bucket.numpy(),
                           self.pair_keys.numpy(), self.pair_counts.numpy(), self.follow_totals.numpy(), self.n_meta)
