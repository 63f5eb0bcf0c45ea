import numpy as np
import pytest

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out


def test_padded_left_and_right_and_truncated():
    seqs = Sequences.from_lists([[1, 2, 3], [4], [5, 6, 7, 8, 9]])
    rows = np.array([0, 1, 2])
    assert seqs.padded(rows).tolist() == [[0, 0, 1, 2, 3], [0, 0, 0, 0, 4], [5, 6, 7, 8, 9]]
    assert seqs.padded(rows, left=False).tolist() == [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [5, 6, 7, 8, 9]]
    # max_len keeps the most recent items.
    assert seqs.padded(rows, max_len=2).tolist() == [[2, 3], [0, 4], [8, 9]]
    assert seqs.padded(np.array([1, 0])).tolist() == [[0, 0, 4], [1, 2, 3]]


def test_drop_last_and_last():
    seqs = Sequences.from_lists([[1, 2, 3], [4, 5, 6, 7]])
    assert seqs.drop_last(2).to_lists() == [[1], [4, 5]]
    assert seqs.last(1).tolist() == [3, 7]
    assert seqs.last(2).tolist() == [2, 6]
    with pytest.raises(ValueError, match="more than 3"):
        seqs.drop_last(3)


def test_leave_one_out_positions_and_counts():
    rows = [[1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11, 12]]
    split = leave_one_out(Sequences.from_lists(rows))
    assert split.train.to_lists() == [[1], [4, 5], [8, 9, 10]]
    assert split.valid_targets.tolist() == [2, 6, 11]
    assert split.test_targets.tolist() == [3, 7, 12]
    assert split.inputs("valid").to_lists() == [[1], [4, 5], [8, 9, 10]]
    assert split.inputs("test").to_lists() == [[1, 2], [4, 5, 6], [8, 9, 10, 11]]
    total = sum(map(len, rows))
    assert len(split.train.items) + len(split.valid_targets) + len(split.test_targets) == total


def test_no_test_target_in_any_training_or_validation_input():
    rng = np.random.default_rng(0)
    # Each user's items are distinct, so position leaks would show up as id leaks.
    rows = [list(rng.permutation(np.arange(1, 60))[: rng.integers(3, 30)]) for _ in range(200)]
    split = leave_one_out(Sequences.from_lists(rows))
    valid_inputs, test_inputs = split.inputs("valid"), split.inputs("test")
    for u in range(len(rows)):
        assert split.test_targets[u] not in split.train.row(u)
        assert split.test_targets[u] not in valid_inputs.row(u)
        assert split.test_targets[u] not in test_inputs.row(u)
        assert split.valid_targets[u] not in split.train.row(u)
        assert test_inputs.row(u)[-1] == split.valid_targets[u]


def test_short_users_are_refused():
    with pytest.raises(ValueError, match="fewer than 3"):
        leave_one_out(Sequences.from_lists([[1, 2, 3], [1, 2]]))
