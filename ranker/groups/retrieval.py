"""Base: the retriever's view of each candidate (its cosine score, its rank, its gap to the best)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ranker.groups import Columns, FeatureGroup, Inputs, register


@functools.lru_cache(maxsize=16)
def _log1p_ranks(n: int) -> np.ndarray:
    """log1p of the 0-based ranks 0..n-1, float32 (the same for every request of a depth)."""
    ranks = torch.log1p(torch.arange(n, dtype=torch.float32)).numpy()
    ranks.flags.writeable = False
    return ranks


def _compute(x: Inputs) -> Columns:
    assert x.scores is not None
    score = np.where(x.valid, x.scores, 0)  # in the scores' own dtype, as the gap is taken
    return {"retrieval_score": score, "retrieval_rank": _log1p_ranks(x.candidates.shape[1]),
            "score_gap": score[:, :1] - score}


GROUP = register(FeatureGroup(
    "retrieval", ("retrieval_score", "retrieval_rank", "score_gap"), _compute, base=10,
    id_derived=("retrieval_score", "retrieval_rank", "score_gap"),
    doc="cosine of user and item vectors; log1p of the 0-based rank among the candidates; the best candidate's "
        "score minus this one's"))
