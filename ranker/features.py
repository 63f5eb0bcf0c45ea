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

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ranker.extras import META_RECENT, Extras, extra_columns, needs_meta
from ranker.tables import PAIR_WINDOW, YEAR_BUCKET, ItemTables, TableArrays, TorchTables
from retriever.windows import row_groups

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
# one group of `_similarity_features` (a dozen numpy calls and row copies, ~40 us) costs about as much as this many
# more history positions of each row (~1.3 us each at 200 candidates)
HISTORY_GROUP_COST = 32


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
    request-time extras (`ranker.extras.TIME_FEATURES`) only.

    The arithmetic is numpy on CPU arrays (the tensors' memory, no copies): a served request is one user
    and a few hundred candidates, where torch's per-operation dispatch cost more than the arithmetic
    (docs/results/serve/). Offline groups of thousands of users run the same code.
    """
    t = tables.arrays
    cand = candidates.numpy()
    hist = history.numpy()
    b, n = cand.shape
    valid = cand != 0
    unknown = ~t.known[cand] | ~valid | (id_mask.numpy() if id_mask is not None else False)
    vectors = item_vectors.numpy()
    cand_vec = vectors[cand]  # (B, N, D)
    hist_valid = hist != 0  # (B, T)
    hist_len = np.maximum(hist_valid.sum(1), 1)  # (B,)
    dense = np.empty((b, n, len(DENSE_FEATURES)), dtype=np.float32)
    _similarity_features(dense, vectors, hist, hist_valid, hist_len, cand_vec)
    score = np.where(valid, scores.numpy(), 0)  # in the scores' own dtype, as the gap is taken
    dense[..., COLUMN["retrieval_score"]] = score
    dense[..., COLUMN["retrieval_rank"]] = _log1p_ranks(n)
    dense[..., COLUMN["score_gap"]] = score[:, :1] - score
    dense[..., COLUMN["popularity"]] = t.popularity[cand]
    dense[..., COLUMN["is_unknown"]] = unknown
    meta = t.meta[cand]  # (B, N, M)
    _meta_features(dense, t, hist, hist_valid, hist_len, meta)
    dense[..., COLUMN["history_length"]] = _log1p(hist_len.astype(np.float32))[:, None]
    _year_features(dense, t, hist, hist_valid, cand)
    _follow_features(dense, t, hist, cand)
    dense[..., ID_DERIVED] = np.where(unknown[..., None], np.float32(0), dense[..., ID_DERIVED])
    out = torch.from_numpy(dense)
    if extras is not None and extras.names:
        given = _recent_meta_columns(t, hist, meta) if needs_meta(extras.names) else None
        out = torch.cat([out, extra_columns(extras, history, candidates, torch.from_numpy(unknown), at,
                                           last_event, given)], dim=-1)
    out = out * torch.from_numpy(valid[..., None])
    product = torch.from_numpy(np.where(unknown[..., None], np.float32(0), user.numpy()[:, None, :] * cand_vec))
    return FeatureBatch(out, candidates, torch.from_numpy(meta), torch.from_numpy(t.year_bucket[cand]), user, product)


def _log1p(x: np.ndarray) -> np.ndarray:
    """torch's float32 log1p (numpy's may differ by an ulp, and trained rankers saw torch's values)."""
    return torch.log1p(torch.from_numpy(x)).numpy()


@functools.lru_cache(maxsize=16)
def _log1p_ranks(n: int) -> np.ndarray:
    """log1p of the 0-based ranks 0..n-1, float32 (the same for every request of a depth)."""
    ranks = torch.log1p(torch.arange(n, dtype=torch.float32)).numpy()
    ranks.flags.writeable = False
    return ranks


def _similarity_features(dense: np.ndarray, vectors: np.ndarray, history: np.ndarray, hist_valid: np.ndarray,
                         hist_len: np.ndarray, cand_vec: np.ndarray) -> None:
    """The (B, N) cosines of each candidate with the history: max, mean, last item, mean of the last RECENT.

    Rows go in groups of similar history length (`retriever.windows.row_groups`), each cut to its longest
    history: a left-padded batch would otherwise multiply every candidate with every padding position too
    (histories of 50-200 items in one micro-batch: a third of this block's work). Padding adds nothing to any
    of the four, so a row's values do not depend on its group.
    """
    for rows, first in row_groups(history, HISTORY_GROUP_COST):
        _similarity_block(dense, rows, vectors, history[rows, first:], hist_valid[rows, first:], hist_len[rows],
                          cand_vec[rows])


def _similarity_block(dense: np.ndarray, rows: slice | np.ndarray, vectors: np.ndarray, history: np.ndarray,
                      hist_valid: np.ndarray, hist_len: np.ndarray, cand_vec: np.ndarray) -> None:
    """`_similarity_features` for some rows of the batch.

    Computed in float64 and rounded to float32 at the end: in float32 the sums' rounding depends on the
    batch's shape (how many users, how much left padding), and one ulp is enough to send a LightGBM tree
    down another branch, so the same user would be scored differently offline and in a served micro-batch.
    """
    cos = np.matmul(cand_vec.astype(np.float64), vectors[history].astype(np.float64).transpose(0, 2, 1))  # (B,N,T)
    dense[rows, :, COLUMN["history_max_cos"]] = np.maximum(np.where(hist_valid[:, None, :], cos, -np.inf).max(-1),
                                                           -1.0)
    cos *= hist_valid[:, None, :]  # padding positions count 0 from here on
    dense[rows, :, COLUMN["history_mean_cos"]] = cos.sum(-1) / hist_len[:, None]
    dense[rows, :, COLUMN["last_item_cos"]] = cos[..., -1]
    recent = np.maximum(hist_valid[:, -RECENT:].sum(1), 1)
    dense[rows, :, COLUMN["recent_mean_cos"]] = cos[..., -RECENT:].sum(-1) / recent[:, None]


def _year_features(dense: np.ndarray, t: TableArrays, history: np.ndarray, hist_valid: np.ndarray,
                   candidates: np.ndarray) -> None:
    """The candidate's year bucket and its distance to the history's mean bucket (0 when unknown)."""
    years = t.year_bucket[candidates].astype(np.float32)  # (B, N)
    hist_years = t.year_bucket[history].astype(np.float32) * hist_valid
    known_years = (hist_years > 0).sum(1)
    mean_year = hist_years.sum(1, dtype=np.float32) / np.maximum(known_years, 1).astype(np.float32)  # (B,)
    dense[..., COLUMN["year_bucket"]] = years
    dense[..., COLUMN["year_distance"]] = np.where((years > 0) & (known_years[:, None] > 0),
                                                   np.abs(years - mean_year[:, None]), np.float32(0))


def _follow_features(dense: np.ndarray, t: TableArrays, history: np.ndarray, candidates: np.ndarray) -> None:
    """How often the candidate followed the last history item (log1p of the count and the share of that item's
    followers) and log1p of the summed counts from the last RECENT items."""
    recent_items = history[:, -RECENT:]  # (B, R)
    counts = t.follows(recent_items[:, None, :], candidates[:, :, None])  # (B, N, R) float32
    follows_last = counts[..., -1]
    last_total = t.follow_totals[history[:, -1]]  # (B,)
    dense[..., COLUMN["follows_last"]] = _log1p(follows_last)
    dense[..., COLUMN["follows_last_share"]] = follows_last / np.maximum(last_total, np.float32(1))[:, None]
    dense[..., COLUMN["follows_recent"]] = _log1p(counts.sum(-1, dtype=np.float32))


def _meta_features(dense: np.ndarray, t: TableArrays, history: np.ndarray, hist_valid: np.ndarray,
                   hist_len: np.ndarray, meta: np.ndarray) -> None:
    """The share of the candidate's metadata values present in the history, and their mean frequency there."""
    b, n, m = meta.shape
    hist_meta = t.meta[history] * hist_valid[..., None]  # (B, T, M)
    width = t.n_meta + 1
    keys = (np.arange(b)[:, None] * width + hist_meta.reshape(b, -1)).reshape(-1)
    counts = np.bincount(keys, minlength=b * width).reshape(b, width).astype(np.float32)
    counts[:, 0] = 0  # value id 0 = none
    found = np.take_along_axis(counts, meta.reshape(b, n * m), 1).reshape(b, n, m)  # history count per value
    has = np.maximum((meta != 0).sum(-1), 1).astype(np.float32)  # (B, N)
    dense[..., COLUMN["meta_overlap"]] = (found > 0).sum(-1).astype(np.float32) / has
    share = found / hist_len.astype(np.float32)[:, None, None]
    # torch's float32 sum (numpy's pairwise sum rounds differently, and trained rankers saw torch's values)
    dense[..., COLUMN["meta_affinity"]] = torch.from_numpy(share).sum(-1).numpy() / has


def _recent_meta_columns(t: TableArrays, history: np.ndarray, meta: np.ndarray) -> dict[str, Tensor]:
    """`ranker.extras.META_FEATURES`: the share of each candidate's metadata values (meta: (B, N, M) value ids,
    0 = none) held by the newest history item, and by any of the newest META_RECENT (0 without values)."""
    has = np.maximum((meta != 0).sum(-1), 1).astype(np.float32)  # (B, N)
    newest = history[:, -META_RECENT:]
    recent = t.meta[newest] * (newest != 0)[..., None]  # (B, R, M); padding holds no value
    held = meta[:, :, :, None, None] == recent[:, None, None, :, :]  # (B, N, M, R, M)
    held &= (meta != 0)[..., None, None]
    by_item = held.any(-1)  # (B, N, M, R): value m of the candidate is among item r's values
    last = by_item[..., -1].sum(-1).astype(np.float32) / has
    anywhere = by_item.any(-1).sum(-1).astype(np.float32) / has
    return {"meta_last": torch.from_numpy(last), "meta_recent": torch.from_numpy(anywhere)}


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
