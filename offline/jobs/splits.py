"""The groups each evaluated split asks the two-stage system for, under either protocol: leave-one-out's
(`offline.data.split.LeaveOneOut`) or the global temporal split's (`offline.data.temporal.TemporalSplit`)."""

from __future__ import annotations

import numpy as np

from offline.data.split import LeaveOneOut
from offline.data.temporal import TemporalSplit

AnySplit = LeaveOneOut | TemporalSplit


def split_sources(split: AnySplit) -> dict[str, np.ndarray]:
    """The flat item array each split's histories are slices of."""
    return {"train": split.train.items, "valid": split.train.items, "test": split.inputs("test").items}


def split_plans(split: AnySplit) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """{"valid", "test"}: (items, start, end, target) of the groups each evaluated split asks for, the history of
    group g being items[start[g]:end[g]]. Leave-one-out: every user (the validation history is the training row,
    the test one all but the last item). Temporal: the window's warm users, in its order (the validation history is
    the user's training row, all before the validation cut; the test one everything before the test cut)."""
    if isinstance(split, TemporalSplit):
        users, test = split.valid.users, split.test.inputs
        return {"valid": (split.train.items, split.train.offsets[users], split.train.offsets[users + 1],
                          split.valid.targets),
                "test": (test.items, test.offsets[:-1], test.offsets[1:], split.test.targets)}
    test_inputs = split.inputs("test")
    return {"valid": (split.train.items, split.train.offsets[:-1], split.train.offsets[1:], split.valid_targets),
            "test": (test_inputs.items, test_inputs.offsets[:-1], test_inputs.offsets[1:], split.test_targets)}
