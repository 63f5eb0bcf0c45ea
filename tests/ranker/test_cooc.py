"""The co-occurrence source (`ranker.cooc`) and the extra features (`ranker.groups`) on hand-made data."""

from pathlib import Path

import numpy as np
import pytest
import torch

from ranker.cooc import CoocTable, cooc_top, quota, recent_items, union
from ranker.features import DENSE_FEATURES, compute_features, extra_columns
from ranker.groups import Extras
from ranker.groups.cooc import NOT_FOUND
from ranker.tables import ItemTables

# Two users over items 1..5 (CSR): 1 2 3 | 1 2 4 5
OFFSETS = np.array([0, 3, 7])
ITEMS = np.array([1, 2, 3, 1, 2, 4, 5])


def _table() -> CoocTable:
    return CoocTable.build(OFFSETS, ITEMS, n_items=5, top=3, window=2, decay=0.5, last=2)


def test_table_holds_lag_weighted_follow_probabilities() -> None:
    table = _table()
    # item 1 is followed by 2 at lag 1 twice (weight 2) and by 3 and 4 at lag 2 once each (0.5 + 0.5): total 3
    assert table.neighbors[1].tolist() == [2, 3, 4]
    assert table.weights[1].tolist() == pytest.approx([2 / 3, 1 / 6, 1 / 6])
    # item 2: 3 (lag 1), 4 (lag 1), 5 (lag 2, weight 0.5); ties by id
    assert table.neighbors[2].tolist() == [3, 4, 5]
    assert table.weights[2].tolist() == pytest.approx([0.4, 0.4, 0.2])
    assert table.neighbors[3].tolist() == [0, 0, 0]  # nothing follows 3
    assert table.neighbors[0].tolist() == [0, 0, 0]


def test_table_round_trips_without_pickle(tmp_path: Path) -> None:
    table = _table()
    table.save(tmp_path / "cooc.npz")
    again = CoocTable.load(tmp_path / "cooc.npz")
    assert np.array_equal(again.neighbors, table.neighbors)
    assert np.array_equal(again.weights, table.weights)
    assert (again.decay, again.last) == (0.5, 2)


def test_cooc_top_sums_recent_items_with_decay_and_honours_exclusions() -> None:
    table = _table()
    recent = recent_items(np.array([[0, 0, 1, 2]]), 2)  # newest is 2
    assert recent.tolist() == [[1, 2]]
    ids, scores = cooc_top(table, recent, [np.array([], dtype=np.int64)], k=4)
    # 3: 0.4 (from 2) + 0.5 * 1/6 (from 1); 4: the same; 2: 0.5 * 2/3; 5: 0.2; ties by id
    assert ids.tolist() == [[3, 4, 2, 5]]
    assert scores[0].tolist() == pytest.approx([0.4 + 1 / 12, 0.4 + 1 / 12, 1 / 3, 0.2])
    ids, _ = cooc_top(table, recent, [np.array([1, 2, 3])], k=4)
    assert ids.tolist() == [[4, 5, 0, 0]]


def test_union_keeps_the_retrievers_head_adds_the_quota_and_refills() -> None:
    vectors = np.eye(8, 4, dtype=np.float32)[[0, 0, 1, 2, 3, 0, 0, 0]]  # items 1..4 along the axes, 5..7 zero
    user = np.array([[0.8, 0.6, 0.0, 0.0]], dtype=np.float32)
    retrieved = np.array([[1, 2, 5, 6]])
    scores = np.array([[0.8, 0.6, 0.0, 0.0]], dtype=np.float32)
    assert quota(4, 0.5) == 2
    # cooc offers 2 (already in the head), 3, 4, 7: the quota of 2 takes 3 and 4
    ids, merged = union(retrieved, scores, np.array([[2, 3, 4, 7]]), user, vectors, np.array([4]), 0.5)
    assert sorted(ids[0].tolist()) == [1, 2, 3, 4]
    assert ids[0, :2].tolist() == [1, 2]  # ordered by retrieval score; 3 and 4 score 0 (their cosine)
    assert merged[0].tolist() == pytest.approx([0.8, 0.6, 0.0, 0.0])
    # a cooc list with one new item: the free slot goes back to the retriever's next item (5)
    ids, _ = union(retrieved, scores, np.array([[1, 3, 0, 0]]), user, vectors, np.array([4]), 0.5)
    # 3 (cosine 0.0) before 5 (FAISS score 0.0): equal scores keep the merge order (head, cooc items, refill)
    assert ids[0].tolist() == [1, 2, 3, 5]


def test_extra_columns_by_hand_and_batch_independent() -> None:
    table = _table()
    extras = Extras(("cooc_last1", "cooc_last3", "cooc_last10", "cooc_rank", "popularity_trend"),
                    {"cooc": table.torch()})
    history = torch.tensor([[0, 1, 2]])
    candidates = torch.tensor([[3, 5, 1, 0]])
    unknown = torch.tensor([[False, False, True, True]])
    out = extra_columns(extras, history, candidates, unknown)
    assert out.shape == (1, 4, 5)
    assert out[0, 0, :3].tolist() == pytest.approx([0.4, 0.4 + 0.5 / 6, 0.4 + 0.5 / 6])
    assert out[0, 1, :3].tolist() == pytest.approx([0.2, 0.2, 0.2])
    assert out[0, 0, 3] == pytest.approx(0.0)
    assert out[0, 1, 3] == pytest.approx(np.log1p(1.0))
    assert out[0, 2, :3].tolist() == [0.0, 0.0, 0.0]
    assert out[0, 2, 3] == NOT_FOUND
    assert out[0, 0, 4] == pytest.approx(float(table.trend[3]))
    # the same user in a wider, padded batch beside another gets the same bits
    wide = extra_columns(extras, torch.tensor([[0, 0, 0, 1, 2], [1, 2, 4, 5, 3]]),
                         torch.tensor([[3, 5, 1, 0], [1, 2, 3, 4]]), torch.cat([unknown, torch.zeros(1, 4).bool()]))
    assert torch.equal(wide[0], out[0])


def test_compute_features_appends_extras_after_the_base_columns() -> None:
    tables = ItemTables.build(OFFSETS, ITEMS, 5).torch()
    vectors = torch.nn.functional.normalize(torch.randn(6, 4), dim=-1)
    vectors[0] = 0
    args = (tables, vectors, torch.tensor([[1, 2]]), vectors[[2]], torch.tensor([[3, 4]]), torch.tensor([[0.5, 0.4]]))
    base = compute_features(*args)
    extended = compute_features(*args, extras=Extras(("cooc_rank",), {"cooc": _table().torch()}))
    assert base.dense.shape[-1] == len(DENSE_FEATURES)
    assert extended.dense.shape[-1] == len(DENSE_FEATURES) + 1
    assert torch.equal(extended.dense[..., : len(DENSE_FEATURES)], base.dense)


def test_items_added_after_training_follow_nothing_and_are_followed_by_nothing() -> None:
    # ids past the table (items added through POST /admin/items) must neither fail nor alias another pair
    table = CoocTable(np.array([[0, 0], [2, 3], [1, 0], [1, 2]]),
                      np.array([[0, 0], [0.6, 0.4], [1.0, 0], [0.5, 0.5]], dtype=np.float32),
                      np.array([0, 0.1, 0.2, 0.3], dtype=np.float32), 0.7, 3)
    ids, scores = cooc_top(table, np.array([[0, 1, 7]]), [np.zeros(0, dtype=np.int64)], 3)
    assert ids.tolist() == [[2, 3, 0]]
    np.testing.assert_allclose(scores[0, :2], [0.7 * 0.6, 0.7 * 0.4], rtol=1e-6)
    follows = table.torch().follows(torch.tensor([[1, 1, 7, 3]]), torch.tensor([[2, 5, 1, 4]]))
    # (1 -> 5): 1 * n1 + 5 == 2 * n1 + 1 would alias the pair (2 -> 1) without the bound
    assert follows[0].tolist() == pytest.approx([0.6, 0.0, 0.0, 0.0])
    extras = Extras(("popularity_trend",), {"cooc": table.torch()})
    out = extra_columns(extras, torch.tensor([[1, 7]]), torch.tensor([[3, 9]]), torch.tensor([[False, True]]))
    assert out[0, :, 0].tolist() == pytest.approx([0.3, 0.0])


def test_an_excluded_item_added_after_training_bans_nothing_in_another_row() -> None:
    # row 0 excludes item 5 (an item added after training: past the 4-row table), row 1 excludes nothing; keyed
    # row * n1 + id, 0 * 4 + 5 is row 1's item 1, which the batch lost while the same request alone kept it
    table = CoocTable(np.array([[0, 0], [2, 3], [1, 0], [1, 2]]),
                      np.array([[0, 0], [0.6, 0.4], [1.0, 0], [0.5, 0.5]], dtype=np.float32),
                      np.array([0, 0.1, 0.2, 0.3], dtype=np.float32), 0.7, 3)
    recent = np.array([[0, 0, 2], [0, 0, 3]])
    batch, _ = cooc_top(table, recent, [np.array([5]), np.zeros(0, dtype=np.int64)], 2)
    alone, _ = cooc_top(table, recent[1:], [np.zeros(0, dtype=np.int64)], 2)
    assert alone.tolist() == [[1, 2]]
    assert batch[1].tolist() == alone[0].tolist()
    assert batch[0].tolist() == [1, 0]


def test_meta_columns_by_hand_and_batch_independent() -> None:
    # value ids per item (0 = none): 1 {a, b}, 2 {b}, 3 {c}, 4 {a, c}, 5 none
    meta = np.array([[0, 0], [1, 2], [2, 0], [3, 0], [1, 3], [0, 0]])
    tables = ItemTables.build(OFFSETS, ITEMS, 5, meta).torch()
    vectors = torch.nn.functional.normalize(torch.randn(6, 4), dim=-1)
    vectors[0] = 0
    extras = Extras(("meta_last", "meta_recent"))

    def columns(history: list[list[int]], candidates: list[list[int]]) -> torch.Tensor:
        b, n = len(candidates), len(candidates[0])
        out = compute_features(tables, vectors, torch.tensor(history), vectors[[1] * b],
                               torch.tensor(candidates), torch.full((b, n), 0.5), extras=extras)
        return out.dense[..., len(DENSE_FEATURES):]

    # history 3, 1, 2 (newest last): the newest holds {b}; the newest three {a, b, c} (META_RECENT = 3)
    out = columns([[3, 1, 2]], [[4, 1, 5, 3]])
    assert out[0, :, 0].tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0])  # 4 {a, c}: neither; 1 {a, b}: b
    assert out[0, :, 1].tolist() == pytest.approx([1.0, 1.0, 0.0, 1.0])  # 5 has no value: 0
    # only the newest three count: with 3 four back, c is no longer recent
    assert columns([[3, 2, 2, 2]], [[4]])[0, 0].tolist() == pytest.approx([0.0, 0.0])
    # the same user left-padded beside another gets the same bits
    wide = columns([[0, 3, 1, 2], [4, 5, 5, 2]], [[4, 1, 5, 3], [1, 2, 3, 4]])
    assert torch.equal(wide[0], out[0])
    assert wide[1, :, 1].tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0])  # newest three 5, 5, 2: {b}; 4 is older
