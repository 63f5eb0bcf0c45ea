"""Where a model wins: metrics on head vs long-tail targets and by history length (PCRec (KDD 2025), figures 7-8).

Every model is scored from the same per-user full-ranking ranks `seqrec evaluate` computes
(history excluded, ties against the target), and the users are grouped by facts of the data
alone, so the groups are identical for every compared model:

- head / long tail: the target is one of the most popular items that together make up
  ``head_share`` of the training interactions (training positions only), or not;
- history length: the number of items the prediction was made from, in buckets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from common.metrics import mean_metrics
from offline.data.split import LeaveOneOut, Split
from offline.evaluation.evaluate import chunked_target_ranks
from retriever.artifact import RetrieverArtifact

K = 10


def training_counts(split: LeaveOneOut, n_items: int) -> np.ndarray:
    """(n_items + 1,) interactions per item over training positions (row 0, padding, is 0)."""
    return np.bincount(split.train.items, minlength=n_items + 1)[: n_items + 1]


def head_items(counts: np.ndarray, share: float = 0.2) -> np.ndarray:
    """(n_items + 1,) bool: the fewest most-popular items whose training interactions reach ``share`` of all.

    Items are taken by count, most first, ties by internal id; the item that crosses the
    share is in the head. An item never seen in training is never head.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the head share must be in (0, 1), got {share}")
    counts = np.asarray(counts, dtype=np.int64).copy()
    counts[0] = 0
    order = np.argsort(-counts, kind="stable")
    cumulative = np.cumsum(counts[order])
    head = np.zeros(len(counts), dtype=bool)
    if cumulative[-1] == 0:
        return head
    n_head = int(np.searchsorted(cumulative, share * cumulative[-1], side="left")) + 1
    head[order[:n_head]] = True
    return head


def length_edges(lengths: np.ndarray, n_buckets: int = 5) -> list[int]:
    """Inclusive upper bounds of up to ``n_buckets`` history-length buckets of about equal size (the last is
    the longest history), from the data's own quantiles."""
    if n_buckets < 1:
        raise ValueError("the number of length buckets must be >= 1")
    quantiles = np.quantile(lengths, np.arange(1, n_buckets + 1) / n_buckets, method="inverted_cdf")
    return sorted({int(q) for q in quantiles})


def bucket_names(edges: Sequence[int], shortest: int) -> list[str]:
    names, low = [], shortest
    for high in edges:
        names.append(f"{low}" if low == high else f"{low}-{high}")
        low = high + 1
    return names


def assign_buckets(lengths: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """(n,) index of each length's bucket (edges are inclusive upper bounds; above the last: the last)."""
    return np.minimum(np.searchsorted(np.asarray(edges), lengths, side="left"), len(edges) - 1)


def group_metrics(ranks: np.ndarray, group: np.ndarray, names: Sequence[str], k: int = K) -> list[dict[str, Any]]:
    """HR@k and NDCG@k of each group's users (None for a group without users)."""
    rows = []
    for g, name in enumerate(names):
        r = ranks[group == g]
        means = mean_metrics(r, (k,))
        rows.append({"group": name, "users": len(r),
                     **{key: round(means[key], 6) if len(r) else None for key in (f"HR@{k}", f"NDCG@{k}")}})
    return rows


def model_ranks(artifact: RetrieverArtifact, split: LeaveOneOut, which: Split = "test") -> np.ndarray:
    """(n_users,) full-ranking rank of each user's ``which`` target: the ranks behind `seqrec evaluate`."""
    model = artifact.model.eval()
    with torch.inference_mode():
        items = model.item_vectors()
    return chunked_target_ranks(model.user_vectors, items, split.inputs(which), split.targets(which),
                                scale=model.temperature, max_len=artifact.max_len,
                                exclude_seen=artifact.manifest.exclude_seen, desc=f"{which} ranks")


def breakdown(ranks: Mapping[str, np.ndarray], split: LeaveOneOut, n_items: int, *, which: Split = "test",
              head_share: float = 0.2, edges: Sequence[int] | None = None, n_buckets: int = 5,
              k: int = K) -> dict[str, Any]:
    """Head/tail and history-length tables for every model's ranks on the ``which`` split."""
    counts = training_counts(split, n_items)
    head = head_items(counts, head_share)
    targets = split.targets(which)
    lengths = split.inputs(which).lengths
    shortest, longest = int(lengths.min()), int(lengths.max())
    if edges:
        # Given edges are cut to the data's range and closed by its longest history, so every user has a bucket.
        edges = sorted({e for e in edges if shortest <= e < longest} | {longest})
    else:
        edges = length_edges(lengths, n_buckets)
    names = bucket_names(edges, shortest)
    popularity_group = np.where(head[targets], 0, 1)
    length_group = assign_buckets(lengths, edges)
    return {
        "split": which, "k": k,
        "head": {"share": head_share, "items": int(head.sum()), "catalogue": n_items,
                 "interaction_share": round(float(counts[head].sum() / max(counts.sum(), 1)), 6)},
        "popularity": {"groups": ["head", "long tail"],
                       "models": {label: group_metrics(r, popularity_group, ("head", "long tail"), k)
                                  for label, r in ranks.items()}},
        "length": {"edges": list(edges), "groups": names,
                   "models": {label: group_metrics(r, length_group, names, k) for label, r in ranks.items()}},
    }
