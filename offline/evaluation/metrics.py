"""Full-ranking metrics with pessimistic ties.

The target is ranked against every item (no sampled negatives). Items the caller
excludes (the user's history) and the padding column 0 are removed from the ranking;
the target itself is never removed. An item scoring exactly the target's score ranks
ahead of it, so a model that scores everything equally gets the worst rank, not the best.
The metrics of the ranks are common/metrics.py's, shared with the ranker.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from common.metrics import DEFAULT_KS, mean_metrics


def pessimistic_ranks(scores: Tensor, targets: Tensor, exclude: Tensor | None = None) -> Tensor:
    """(B,) 1-based rank of each target: 1 + the number of other ranked items scoring >= it.

    scores: (B, n_items + 1) floats over internal ids, column 0 = padding.
    targets: (B,) internal ids in [1, n_items].
    exclude: optional (B, n_items + 1) bool, True = removed from the ranking.
    """
    _check(scores, targets, exclude)
    target_scores = scores.gather(1, targets[:, None])  # (B, 1)
    ahead = scores >= target_scores  # (B, N + 1)
    ahead[:, 0] = False
    if exclude is not None:
        ahead.masked_fill_(exclude, False)
    ahead.scatter_(1, targets[:, None], False)
    # int32 accumulation is ~3x faster than the default int64 sum of a bool tensor.
    return ahead.sum(dim=1, dtype=torch.int32).long() + 1


def full_ranking_metrics(
    scores: Tensor, targets: Tensor, exclude: Tensor | None = None, ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """Means over the batch of HR/NDCG/MRR/Recall at each k (see pessimistic_ranks; the metrics: common/metrics.py)."""
    return mean_metrics(pessimistic_ranks(scores, targets, exclude).cpu().numpy(), ks)


def _check(scores: Tensor, targets: Tensor, exclude: Tensor | None) -> None:
    if scores.ndim != 2 or targets.ndim != 1 or len(targets) != len(scores):
        raise ValueError(f"expected scores (B, n_items + 1) and targets (B,), got {tuple(scores.shape)} and "
                         f"{tuple(targets.shape)}")
    if not scores.is_floating_point():
        raise ValueError("scores must be floating point")
    if targets.dtype != torch.long:
        raise ValueError("targets must be a long tensor of internal item ids")
    if len(targets) and (int(targets.min()) < 1 or int(targets.max()) >= scores.shape[1]):
        raise ValueError("targets must be internal ids in [1, n_items] (0 is padding)")
    if scores.numel() and torch.isnan(scores.amax()):  # amax propagates NaN, cheaper than isnan().any()
        raise ValueError("scores contain NaN; a NaN cannot be ranked")
    if exclude is not None and (exclude.shape != scores.shape or exclude.dtype != torch.bool):
        raise ValueError("exclude must be a bool tensor shaped like scores")
