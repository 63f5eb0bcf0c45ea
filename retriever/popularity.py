"""The popularity baseline: every user gets the items most often seen in training.

Also the service's fallback for requests without a usable history.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class Popularity:
    """Scores each item by its count over training positions; column 0 (padding) is -inf."""

    def __init__(self, counts: Tensor) -> None:
        if counts.ndim != 1 or len(counts) < 2:
            raise ValueError("counts must be a 1-D tensor over internal ids, padding included")
        self.counts = counts.to(torch.float32)
        self._scores = self.counts.clone()
        self._scores[0] = float("-inf")

    @classmethod
    def fit(cls, train_items: np.ndarray, n_items: int) -> Popularity:
        """train_items: the internal ids at every training position (flat)."""
        if len(train_items) and (train_items.min() < 1 or train_items.max() > n_items):
            raise ValueError(f"training items must be internal ids in [1, {n_items}]")
        counts = np.bincount(train_items, minlength=n_items + 1)
        counts[0] = 0
        return cls(torch.from_numpy(counts))

    @property
    def n_items(self) -> int:
        return len(self.counts) - 1

    def score(self, histories: Tensor) -> Tensor:
        """(B, T) padded histories -> (B, n_items + 1) scores (the same row for everyone)."""
        return self._scores.expand(histories.shape[0], -1)
