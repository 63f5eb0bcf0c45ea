"""The ranker's tables (offline/jobs/tables.py) count training positions only: each user's sequence less its
validation and test targets, and for a training group's tables less its last ``drop_last`` training items too.
The expected tables are built here from the prepared sequences cut by hand, not through the split's code."""

from __future__ import annotations

import numpy as np
import pytest

from offline.data.prepared import PreparedDataset, load_prepared
from offline.jobs.tables import cooc_table, item_tables, time_table
from ranker.cooc import CoocTable
from ranker.tables import ItemTables
from ranker.times import TimeTable
from tests.tiny import prepare_tiny


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    return load_prepared(prepare_tiny(tmp_path_factory.mktemp("tables") / "tiny"))


def _cut(data: PreparedDataset, held_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, items, timestamps) of every user's prepared sequence less its last ``held_out`` items."""
    seq = data.sequences
    assert seq.timestamps is not None
    rows = [(seq.items[a:b - held_out], seq.timestamps[a:b - held_out])
            for a, b in zip(seq.offsets[:-1], seq.offsets[1:], strict=True)]
    offsets = np.concatenate([[0], np.cumsum([len(items) for items, _ in rows])]).astype(np.int64)
    return offsets, np.concatenate([items for items, _ in rows]), np.concatenate([times for _, times in rows])


@pytest.mark.parametrize("drop_last", [0, 1, 3])
def test_every_table_counts_training_positions_only(data: PreparedDataset, drop_last: int) -> None:
    split = data.split()
    offsets, items, times = _cut(data, 2 + drop_last)  # validation and test targets, then drop_last more
    got = item_tables(data, split, drop_last)
    want = ItemTables.build(offsets, items, data.n_items, got.meta, None)
    for name in ("popularity", "known", "pair_keys", "pair_counts", "follow_totals"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    got_cooc, want_cooc = cooc_table(data, split, drop_last), CoocTable.build(offsets, items, data.n_items)
    for name in ("neighbors", "weights", "trend"):
        np.testing.assert_array_equal(getattr(got_cooc, name), getattr(want_cooc, name), err_msg=name)
    got_times, want_times = time_table(data, split, drop_last), TimeTable.build(items, times, data.n_items)
    for name in ("items", "times", "first"):
        np.testing.assert_array_equal(getattr(got_times, name), getattr(want_times, name), err_msg=name)


def test_the_cut_makes_a_difference_the_tables_can_show(data: PreparedDataset) -> None:
    """Without this the test above could pass with tables that ignore the cut."""
    counts = [np.bincount(_cut(data, held_out)[1], minlength=data.n_items + 1) for held_out in (0, 2, 3)]
    assert not np.array_equal(counts[0], counts[1])
    assert not np.array_equal(counts[1], counts[2])
    full, train = (ItemTables.build(*_cut(data, n)[:2], data.n_items) for n in (0, 2))
    assert not np.array_equal(full.popularity, train.popularity)
