"""The second stage: the ranker's features and scores over a candidate list, and the served top k.

One definition of each, for every caller: the service (`service.system.recommend.recommend_batch`) and
`seqrec evaluate`'s two-stage figures and the parity bench (`offline.evaluation.two_stage`). The features come
from `ranker.features.compute_features`, the code the ranker was trained on, so serving and training cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ranker.features import FeatureBatch, compute_features
from ranker.groups import Extras
from ranker.tables import TorchTables


def rerank_scores(score: Callable[[FeatureBatch], Tensor], tables: TorchTables, item_vectors: Tensor,
                  history: Tensor, user: Tensor, candidates: Tensor, retrieval: Tensor, *,
                  extras: Extras | None = None, at: Tensor | None = None, last_event: Tensor | None = None,
                  id_mask: Tensor | None = None) -> Tensor:
    """(B, N) the ranker's scores (``score``, a ranker's or its compiled form's) of (B, N) candidate internal ids
    (0 = empty) for (B, T) left-padded histories.

    item_vectors: (n_items + 1, D) unit item vectors; user: (B, D) unit user vectors; retrieval: the candidates'
    retrieval scores, 0 in empty slots; at / last_event: (B,) float64 request and newest-event times for a ranker
    with request-time features; id_mask: (B, N) the candidates scored as unknown (cold start)."""
    with torch.inference_mode():
        batch = compute_features(tables, item_vectors, history, user, candidates, retrieval, id_mask=id_mask,
                                 extras=extras, at=at, last_event=last_event)
        return score(batch)


def top_k(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """Positions of a list's k best candidates, best first: by score, ties in retrieval order (a stable sort of
    candidates that arrive best-retrieved first, so the order never depends on the batch), empty slots
    (candidate 0) never. scores, candidates: (N,)."""
    keep = np.flatnonzero(candidates > 0)
    return keep[np.argsort(-scores[keep], kind="stable")][:k]
