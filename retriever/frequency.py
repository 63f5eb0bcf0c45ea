"""The personal-frequency baseline: a user's own past items first, by how often (and how recently) they came back,
then every other item by its popularity over training positions.

A history item's weight is the sum over its occurrences of ``decay ** age``, age 0 for the last item of the
history: ``decay = 1`` counts occurrences, a smaller one favours what the user did recently. The decay is a choice
made on validation (offline/evaluation/frequency.py), never on test.

Under the exclude repeat policy (retriever/repeats.py) the history is removed from the ranking, so what is left is
the popularity order over the unseen items: the model equals the popularity baseline there. It differs only where
repeats are allowed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from retriever.popularity import Popularity

DECAYS = (1.0, 0.9, 0.7, 0.5, 0.2)  # the validation grid: counts, then ever stronger recency
_SEEN = 2.0  # every history item scores above every other (their popularity term is below 1)
_TIE_BREAK = 1e-3  # popularity's share of a history item's score: it orders equal weights only


class PersonalFrequency:
    """Orders history items by ``2 + weight + 1e-3 * p``, the others by ``p``, with ``p`` the item's training count
    over the largest count plus one (in [0, 1)); column 0 (padding) is -inf."""

    def __init__(self, popularity: Popularity, decay: float = 1.0) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.popularity = popularity
        self.decay = decay
        counts = popularity.counts.to(torch.float64)
        self._backoff = counts / (float(counts.max()) + 1.0)
        self._backoff[0] = float("-inf")

    @classmethod
    def fit(cls, train_items: np.ndarray, n_items: int, decay: float = 1.0) -> PersonalFrequency:
        """train_items: the internal ids at every training position (flat): the back-off's counts."""
        return cls(Popularity.fit(train_items, n_items), decay)

    @property
    def n_items(self) -> int:
        return self.popularity.n_items

    def weights(self, histories: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, n_items + 1) float64 sums of ``decay ** age`` (0 off the history)."""
        T = histories.shape[1]
        age = torch.arange(T - 1, -1, -1, dtype=torch.float64)  # the last column is the most recent item
        step = (self.decay ** age).expand(histories.shape[0], -1) * (histories != 0)  # (B, T), padding weighs 0
        weights = torch.zeros(histories.shape[0], self.n_items + 1, dtype=torch.float64)
        return weights.scatter_add_(1, histories.long(), step)

    def score(self, histories: Tensor) -> Tensor:
        """(B, T) padded histories -> (B, n_items + 1) float32 scores: history items first, by weight.

        The order is decided in float64 and returned as each item's dense rank from the bottom (equal scores
        keep equal ranks), which float32 holds exactly, so the popularity tie-break survives the evaluation's
        float32 comparison."""
        weights = self.weights(histories)
        backoff = self._backoff.expand_as(weights)
        exact = torch.where(weights > 0, _SEEN + weights + _TIE_BREAK * backoff, backoff)  # (B, N + 1)
        ordered, order = exact.sort(dim=1)
        rises = torch.ones_like(ordered, dtype=torch.float32)
        rises[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).to(torch.float32)
        dense = torch.empty_like(rises).scatter_(1, order, rises.cumsum(dim=1))
        dense[:, 0] = float("-inf")
        return dense
