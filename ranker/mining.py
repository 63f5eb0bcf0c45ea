"""Hard-negative mining's record: the retriever's top-N for the history before each target.

A group is one (history, target) pair: the candidates are what the served retriever
returns for that history (FAISS index, under the bundle's repeat policy: the whole history
excluded, or nothing), label 1 goes to the true next item and 0 to the others, the hard
negatives. Under exclude a repeat target is never among the candidates, so its group has
no positive, as when the retriever misses the target: such groups count as misses in
evaluation and are left out of the ranker's training (a list without its positive teaches
a listwise or LambdaRank loss nothing). Training groups come from training
positions only (each user's last few training targets); the validation target's group
drives the ranker's early stopping and the test target's group is its final evaluation.

Histories are given as slices of one flat item array (``items[start:end]``), so a group
costs two integers, not a copy of its history. The search itself is the served system's
(`offline.jobs.mine.mine`, through `service.system.retrieve`); this module holds what the ranker trains on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Mined:
    """start/end: each group's history is items[start:end] of the source it was mined from."""

    start: np.ndarray  # (G,) int64
    end: np.ndarray  # (G,) int64
    target: np.ndarray  # (G,) internal id
    candidates: np.ndarray  # (G, N) internal ids, best first; 0 = empty slot
    scores: np.ndarray  # (G, N) float32 cosine scores; 0 in empty slots
    # (G, D) the unit user vectors the groups were searched with (not saved: `offline.jobs.mine.with_user_vectors`
    # computes them again for groups loaded from disk); None until then
    user: Tensor | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.target)

    @property
    def depth(self) -> int:
        return int(self.candidates.shape[1])

    @property
    def label(self) -> np.ndarray:
        """(G,) position of the target among the candidates, -1 when the retriever missed it."""
        hit = self.candidates == self.target[:, None]
        return np.where(hit.any(1), hit.argmax(1), -1)

    def recall(self) -> float:
        """Share of groups whose target is among the candidates: the two-stage ceiling."""
        return float((self.label >= 0).mean()) if len(self) else 0.0

    def subset(self, rows: np.ndarray) -> Mined:
        return Mined(self.start[rows], self.end[rows], self.target[rows], self.candidates[rows], self.scores[rows],
                     None if self.user is None else self.user[torch.as_tensor(rows)])

    def save(self, path: Path) -> None:
        with path.open("wb") as handle:
            np.savez(handle, start=self.start, end=self.end, target=self.target, candidates=self.candidates,
                     scores=self.scores)

    @classmethod
    def load(cls, path: Path) -> Mined:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["start"], z["end"], z["target"], z["candidates"], z["scores"])


def training_groups(offsets: np.ndarray, per_user: int, min_history: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(history end, target position) of each user's last ``per_user`` training targets.

    offsets: CSR offsets of training positions only, so no validation or test target can
    become a training example. A target needs at least ``min_history`` items before it.
    """
    starts, ends = offsets[:-1], offsets[1:]
    target_pos, history_start = [], []
    for back in range(1, per_user + 1):
        pos = ends - back  # absolute index of the target
        ok = pos - starts >= min_history
        target_pos.append(pos[ok])
        history_start.append(starts[ok])
    return np.concatenate(history_start).astype(np.int64), np.concatenate(target_pos).astype(np.int64)
