"""Ranking metrics from 1-based target ranks: the one definition of HR, NDCG, MRR and Recall at a cut-off.

Retriever evaluation, the ranker's early stopping and selection, the breakdowns and the benches all score
ranks with these functions. They live in `common` because the ranker's training may import only `common`
and `retriever`, and they need numpy alone. The values and their means are float64 and computed by numpy
(pairwise summation), so every caller gets the same digits from the same ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_KS = (1, 5, 10)


def metrics_from_ranks(ranks: np.ndarray, ks: Sequence[int] = DEFAULT_KS) -> dict[str, np.ndarray]:
    """Per-user metric values (float64 arrays of shape (B,)) from 1-based ranks, as {"HR@k": ..., ...}.

    A target ranked past k scores 0 at k. With one target per user Recall@k equals HR@k; both are
    reported so tables from papers that use either name line up.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    for k in ks:
        hit = (ranks <= k).astype(np.float64)
        out[f"HR@{k}"] = hit
        out[f"NDCG@{k}"] = hit / np.log2(ranks + 1.0)
        out[f"MRR@{k}"] = hit / ranks
        out[f"Recall@{k}"] = hit
    return out


def mean_metrics(ranks: np.ndarray, ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """The users' mean of each metric of :func:`metrics_from_ranks` (NaN for no users)."""
    return {name: float(values.mean()) if len(values) else float("nan")
            for name, values in metrics_from_ranks(ranks, ks).items()}


def ndcg_at(ranks: np.ndarray, k: int = 10) -> float:
    """Mean NDCG@k of the ranks (0.0 for no users): the ranker's early-stopping and selection metric."""
    return mean_metrics(ranks, (k,))[f"NDCG@{k}"] if len(ranks) else 0.0
