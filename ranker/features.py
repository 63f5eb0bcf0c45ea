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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ranker.extras import Extras, extra_columns

DENSE_FEATURES = (
    "retrieval_score",  # cosine of user and item vectors
    "retrieval_rank",  # log1p of the 0-based rank among the candidates
    "score_gap",  # best candidate's score minus this one's
    "popularity",  # log1p(training count) / log1p(max count)
    "is_unknown",
    "history_max_cos",  # candidate vs each history item (retriever item vectors)
    "history_mean_cos",
    "last_item_cos",
    "recent_mean_cos",  # mean over the last RECENT history items
    "meta_overlap",  # share of the candidate's metadata values present in the history
    "meta_affinity",  # mean frequency of the candidate's values in the history
    "history_length",  # log1p
    "year_bucket",  # 0 = unknown
    "year_distance",  # |candidate year bucket - mean history year bucket|, 0 when unknown
    "follows_last",  # log1p(times the candidate followed the last history item within PAIR_WINDOW steps)
    "follows_last_share",  # that count / times the last item was followed by anything
    "follows_recent",  # log1p(sum of the counts from the last RECENT history items)
)
COLUMN = {name: i for i, name in enumerate(DENSE_FEATURES)}
# Columns computed from the retriever's ID-trained vectors or from the item's own interaction
# history: not trusted (zeroed) for unknown items.
ID_DERIVED = tuple(COLUMN[n] for n in ("retrieval_score", "retrieval_rank", "score_gap", "history_max_cos",
                                        "history_mean_cos", "last_item_cos", "recent_mean_cos", "follows_last",
                                        "follows_last_share", "follows_recent"))
RECENT = 5
PAIR_WINDOW = 3  # b "follows" a when it comes 1..PAIR_WINDOW positions after a in a training sequence
YEAR_BUCKET = 5  # years per bucket
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
class TorchTables:
    popularity: Tensor
    known: Tensor
    meta: Tensor
    year_bucket: Tensor
    pair_keys: Tensor
    pair_counts: Tensor
    follow_totals: Tensor
    n_meta: int

    def follows(self, source: Tensor, target: Tensor) -> Tensor:
        """How often ``target`` followed ``source`` in training (elementwise; 0 for padding)."""
        n = self.popularity.shape[0]
        keys = source * n + target
        if len(self.pair_keys) == 0:
            return torch.zeros(keys.shape, dtype=torch.float32, device=keys.device)
        pos = torch.searchsorted(self.pair_keys, keys.reshape(-1)).clamp(max=len(self.pair_keys) - 1)
        found = self.pair_keys[pos] == keys.reshape(-1)
        counts = torch.where(found, self.pair_counts[pos], torch.zeros_like(self.pair_counts[pos]))
        return (counts * ((source != 0) & (target != 0)).reshape(-1)).reshape(keys.shape)


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
) -> FeatureBatch:
    """Features for (B, N) candidates of B requests.

    item_vectors: (n_items + 1, D) unit retriever item vectors; history: (B, T) left-padded
    internal ids (the items the user vector was computed from); user: (B, D) unit user
    vectors; candidates: (B, N) internal ids (0 = empty slot), best first; scores: (B, N)
    their cosine scores. id_mask: (B, N) True where the candidate's ID must be treated as
    unknown (ID dropout in training, the cold-start simulation in evaluation).
    """
    b, n = candidates.shape
    valid = candidates != 0
    unknown = ~tables.known[candidates] | ~valid
    if id_mask is not None:
        unknown = unknown | id_mask
    cand_vec = item_vectors[candidates]  # (B, N, D)
    hist_valid = history != 0  # (B, T)
    hist_len = hist_valid.sum(1).clamp(min=1)  # (B,)
    history_max, history_mean, last, recent = _similarity_features(item_vectors, history, hist_valid, hist_len,
                                                                   cand_vec)

    scores = torch.where(valid, scores, torch.zeros_like(scores))
    rank = torch.log1p(torch.arange(n, dtype=torch.float32, device=scores.device)).expand(b, n)
    gap = scores[:, :1] - scores

    meta = tables.meta[candidates]  # (B, N, M)
    meta_overlap, meta_affinity = _meta_features(tables, history, hist_valid, hist_len, meta)
    years, year_distance = _year_features(tables, history, hist_valid, candidates)
    follows_last, share, follows_recent = _follow_features(tables, history, candidates)

    columns = [
        scores, rank, gap, tables.popularity[candidates], unknown.float(), history_max, history_mean, last, recent,
        meta_overlap, meta_affinity, torch.log1p(hist_len.float())[:, None].expand(b, n), years, year_distance,
        torch.log1p(follows_last), share, torch.log1p(follows_recent),
    ]
    dense = torch.stack([c.float() for c in columns], dim=-1)  # (B, N, F)
    dense[..., list(ID_DERIVED)] = dense[..., list(ID_DERIVED)].masked_fill(unknown[..., None], 0.0)
    if extras is not None and extras.names:
        dense = torch.cat([dense, extra_columns(extras, history, candidates, unknown)], dim=-1)
    dense = dense * valid[..., None]
    product = (user[:, None, :] * cand_vec).masked_fill(unknown[..., None], 0.0)
    return FeatureBatch(dense, candidates, meta, tables.year_bucket[candidates], user, product)


def _similarity_features(item_vectors: Tensor, history: Tensor, hist_valid: Tensor, hist_len: Tensor,
                         cand_vec: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(B, N) cosine of each candidate with the history: max, mean, last item, mean of the last RECENT.

    Computed in float64 and rounded to float32 at the end: in float32 the sums' rounding depends on the
    batch's shape (how many users, how much left padding), and one ulp is enough to send a LightGBM tree
    down another branch, so the same user would be scored differently offline and in a served micro-batch.
    """
    cos = torch.einsum("bnd,btd->bnt", cand_vec.double(), item_vectors[history].double())  # (B, N, T)
    cos_masked = cos.masked_fill(~hist_valid[:, None, :], -torch.inf)
    history_max = cos_masked.amax(-1).clamp(min=-1.0)  # all-padding history -> -1
    history_mean = (cos * hist_valid[:, None, :]).sum(-1) / hist_len[:, None]
    last = cos[..., -1] * hist_valid[:, None, -1]
    recent_valid = hist_valid[:, -RECENT:]
    recent = (cos[..., -RECENT:] * recent_valid[:, None, :]).sum(-1) / recent_valid.sum(1).clamp(min=1)[:, None]
    return history_max.float(), history_mean.float(), last.float(), recent.float()


def _year_features(tables: TorchTables, history: Tensor, hist_valid: Tensor,
                   candidates: Tensor) -> tuple[Tensor, Tensor]:
    """(B, N) the candidate's year bucket and its distance to the history's mean bucket (0 when unknown)."""
    years = tables.year_bucket[candidates].float()  # (B, N)
    hist_years = tables.year_bucket[history].float() * hist_valid
    known_years = (hist_years > 0).sum(1)
    mean_year = hist_years.sum(1) / known_years.clamp(min=1)  # (B,)
    year_distance = torch.where((years > 0) & (known_years[:, None] > 0), (years - mean_year[:, None]).abs(),
                                torch.zeros_like(years))
    return years, year_distance


def _follow_features(tables: TorchTables, history: Tensor, candidates: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, N) how often the candidate followed the last history item (count and share of that item's
    followers) and the summed counts from the last RECENT items."""
    b, n = candidates.shape
    last_item = history[:, -1:].expand(b, n)  # (B, N)
    follows_last = tables.follows(last_item, candidates)
    share = follows_last / tables.follow_totals[last_item].clamp(min=1.0)
    recent_items = history[:, -RECENT:]  # (B, R)
    follows_recent = tables.follows(recent_items[:, None, :].expand(b, n, -1),
                                    candidates[:, :, None].expand(-1, -1, recent_items.shape[1])).sum(-1)
    return follows_last, share, follows_recent


def _meta_features(tables: TorchTables, history: Tensor, hist_valid: Tensor, hist_len: Tensor,
                   meta: Tensor) -> tuple[Tensor, Tensor]:
    b, n, m = meta.shape
    hist_meta = tables.meta[history] * hist_valid[..., None]  # (B, T, M)
    counts = torch.zeros(b, tables.n_meta + 1, device=meta.device)
    counts.scatter_add_(1, hist_meta.reshape(b, -1), torch.ones_like(hist_meta.reshape(b, -1), dtype=torch.float32))
    counts[:, 0] = 0  # value id 0 = none
    found = counts.gather(1, meta.reshape(b, n * m)).reshape(b, n, m)  # (B, N, M) history count per value
    has = (meta != 0).sum(-1).clamp(min=1)  # (B, N)
    overlap = (found > 0).sum(-1) / has
    affinity = (found / hist_len[:, None, None]).sum(-1) / has
    return overlap.float(), affinity.float()


def standardize_stats(dense: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Per-column mean and std over valid candidate slots (for the MLP's fixed input scaling)."""
    rows = dense[valid]
    mean = rows.mean(0)
    std = rows.std(0).clamp(min=1e-6)
    return mean, std


def feature_spec(tables: ItemTables, dim: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a ranker was trained on, stored with it and checked at load."""
    return {"dense": [*DENSE_FEATURES, *extra], "id_derived": [DENSE_FEATURES[i] for i in ID_DERIVED],
            "n_items": tables.n_items, "n_meta": tables.n_meta, "n_year_buckets": tables.n_year_buckets,
            "meta_width": int(tables.meta.shape[1]), "dim": dim, "recent": RECENT, "year_bucket_years": YEAR_BUCKET,
            "pair_window": PAIR_WINDOW}


def unit(x: Tensor) -> Tensor:
    return F.normalize(x.float(), dim=-1)
