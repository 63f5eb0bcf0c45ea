"""Leave-one-out: test target = each user's last item, validation target = the one before.

Sequences arrive already in time order (stable sort by timestamp, file order on ties,
done once by `seqrec prepare`), so the split is positional and cannot reorder ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from offline.data.sequences import Sequences

Split = Literal["valid", "test"]
MIN_LENGTH = 3  # one training item, one validation target, one test target


@dataclass(frozen=True)
class LeaveOneOut:
    """train: every user's items but the last two (the only positions models learn from).
    valid_targets / test_targets: (n_users,) internal item ids.
    """

    full: Sequences
    train: Sequences
    valid_targets: np.ndarray
    test_targets: np.ndarray

    def inputs(self, split: Split) -> Sequences:
        """What a model sees when predicting a split's target: everything before it."""
        if split == "valid":
            return self.train
        if split == "test":
            return self.full.drop_last(1)
        raise ValueError(f"unknown split {split!r}; expected 'valid' or 'test'")

    def take(self, users: np.ndarray) -> LeaveOneOut:
        """The same split restricted to some users (row indices), e.g. a validation sample."""
        return LeaveOneOut(self.full.take(users), self.train.take(users), self.valid_targets[users],
                           self.test_targets[users])

    def targets(self, split: Split) -> np.ndarray:
        if split == "valid":
            return self.valid_targets
        if split == "test":
            return self.test_targets
        raise ValueError(f"unknown split {split!r}; expected 'valid' or 'test'")


def repeat_targets(inputs: Sequences, targets: np.ndarray) -> np.ndarray:
    """(n_users,) bool: the user's target already occurs in what the model sees before it."""
    user = np.repeat(np.arange(len(inputs)), inputs.lengths)
    seen = inputs.items == np.asarray(targets)[user]
    return np.bincount(user[seen], minlength=len(inputs)) > 0


def repeat_shares(split: LeaveOneOut) -> dict[str, float]:
    """{"valid": share, "test": share} of targets that repeat an item of their own history."""
    return {name: round(float(repeat_targets(split.inputs(name), split.targets(name)).mean()), 6)
            if len(split.full) else 0.0 for name in ("valid", "test")}


def leave_one_out(sequences: Sequences) -> LeaveOneOut:
    short = np.flatnonzero(sequences.lengths < MIN_LENGTH)
    if len(short):
        raise ValueError(
            f"{len(short)} users have fewer than {MIN_LENGTH} interactions (first: row {short[0]}); "
            f"prepare the data with --min-user-interactions {MIN_LENGTH} or more"
        )
    return LeaveOneOut(
        full=sequences,
        train=sequences.drop_last(2),
        valid_targets=sequences.last(2),
        test_targets=sequences.last(1),
    )
