"""The global temporal split on hand-made sequences, with the expected windows written out."""

from __future__ import annotations

import numpy as np
import pytest

from offline.data.sequences import Sequences
from offline.data.temporal import TemporalError, cut_time, repeat_shares, temporal_split


def sequences(rows: list[list[tuple[int, int]]]) -> Sequences:
    """Rows of (item, time), already in time order (ties in file order)."""
    base = Sequences.from_lists([[item for item, _ in row] for row in rows])
    return Sequences(base.offsets, base.items, np.array([t for row in rows for _, t in row], dtype=np.int64))


# Cuts given as times: validation at 10, test at 20.
ROWS = [
    [(1, 1), (2, 5), (3, 10), (4, 12), (5, 20), (6, 25)],  # warm in both windows
    [(2, 2), (1, 9)],                                       # nothing after the validation cut
    [(7, 11), (3, 15), (8, 21)],                            # cold in validation, warm in test
    [(1, 3), (9, 20), (9, 20), (2, 20)],                    # ties at the test cut keep file order
    [(8, 22)],                                              # cold in test
]


@pytest.fixture
def split():
    data = sequences(ROWS)
    # Quantile cuts resolve to times; here the times themselves are wanted, so give them as dates of the epoch.
    return temporal_split(data, "1970-01-01T00:00:10+00:00", "1970-01-01T00:00:20+00:00")


def test_training_holds_only_interactions_before_the_validation_cut(split):
    assert split.train.to_lists() == [[1, 2], [2, 1], [], [1], []]
    assert (split.train.timestamps < 10).all()
    assert split.refit_train.to_lists() == [[1, 2, 3, 4], [2, 1], [7, 3], [1], []]


def test_validation_window_inputs_targets_and_horizon(split):
    valid = split.valid
    assert valid.users.tolist() == [0]
    assert split.inputs("valid").to_lists() == [[1, 2]]
    assert split.targets("valid").tolist() == [3]
    assert split.horizon("valid").to_lists() == [[3, 4]]
    assert valid.cold_users == 1
    assert valid.cold_interactions == 2


def test_test_window_ties_keep_file_order(split):
    test = split.test
    assert test.users.tolist() == [0, 2, 3]
    assert split.inputs("test").to_lists() == [[1, 2, 3, 4], [7, 3], [1]]
    assert split.targets("test").tolist() == [5, 8, 9]  # user 3's first item at the cut in file order: 9, not 2
    assert split.horizon("test").to_lists() == [[5, 6], [8], [9, 9, 2]]
    assert test.cold_users == 1
    assert test.cold_interactions == 1


def test_new_items_are_those_first_seen_at_or_after_the_cut(split):
    # item 3 is first seen at t = 10, the validation cut itself: new there
    assert (np.flatnonzero(split.valid.new_items[1:]) + 1).tolist() == [3, 4, 5, 6, 7, 8, 9]
    assert (np.flatnonzero(split.test.new_items[1:]) + 1).tolist() == [5, 6, 8, 9]
    record = split.test.record()
    assert record["new_item_targets"] == 3
    assert record["users"] == 3
    assert record["cold_users"] == 1


def test_quantile_cuts():
    times = np.arange(1, 11)
    assert cut_time("0.8", times) == 8.0
    assert cut_time(0.9, times) == 9.0
    with pytest.raises(TemporalError, match="strictly between 0 and 1"):
        cut_time("1.5", times)
    with pytest.raises(TemporalError, match="neither a quantile"):
        cut_time("yesterday", times)


def test_data_without_timestamps_is_refused():
    with pytest.raises(TemporalError, match="needs timestamps"):
        temporal_split(Sequences.from_lists([[1, 2, 3], [2, 3, 4]]))


def test_cuts_out_of_order_or_leaving_an_empty_window_are_refused():
    data = sequences(ROWS)
    with pytest.raises(TemporalError, match="must come before"):
        temporal_split(data, "0.9", "0.8")
    with pytest.raises(TemporalError, match="holds no user"):
        temporal_split(data, "1970-01-01T00:00:10+00:00", "1970-01-01T00:01:00+00:00")


def test_take_restricts_every_window_and_renumbers_its_users(split):
    part = split.take(np.array([2, 3]))
    assert part.test.users.tolist() == [0, 1]
    assert part.targets("test").tolist() == [8, 9]
    assert part.targets("valid").tolist() == []


def test_repeat_shares_read_the_history_before_the_cut(split):
    assert repeat_shares(split) == {"valid": 0.0, "test": 0.0}
    repeated = temporal_split(sequences([[(1, 1), (2, 2), (1, 10), (1, 20)], [(3, 1), (4, 12), (5, 21)]]),
                              "1970-01-01T00:00:10+00:00", "1970-01-01T00:00:20+00:00")
    assert repeat_shares(repeated) == {"valid": 0.5, "test": 0.5}
