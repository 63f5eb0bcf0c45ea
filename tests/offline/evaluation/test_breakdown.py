"""Head/long-tail and history-length breakdowns: groups by hand, metrics by hand."""

import math

import numpy as np
import pytest

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.evaluation.breakdown import (
    assign_buckets,
    breakdown,
    bucket_names,
    group_metrics,
    head_items,
    length_edges,
)


def test_head_is_the_fewest_most_popular_items_reaching_the_share() -> None:
    counts = np.array([0, 5, 3, 1, 1])  # 10 training interactions; row 0 is padding
    assert np.flatnonzero(head_items(counts, 0.2)).tolist() == [1]  # 5 >= 2
    assert np.flatnonzero(head_items(counts, 0.5)).tolist() == [1]  # 5 >= 5
    assert np.flatnonzero(head_items(counts, 0.6)).tolist() == [1, 2]  # 5 < 6 <= 8
    ties = np.array([0, 2, 2, 2, 2])
    assert np.flatnonzero(head_items(ties, 0.3)).tolist() == [1, 2]  # ties broken by id: 2 < 2.4 <= 4
    assert np.flatnonzero(head_items(np.array([7, 1, 0]), 0.99)).tolist() == [1]  # padding and unseen never head
    with pytest.raises(ValueError, match="share"):
        head_items(counts, 1.0)


def test_length_buckets_from_quantiles_and_their_names() -> None:
    lengths = np.arange(1, 11)
    edges = length_edges(lengths, 5)
    assert edges == [2, 4, 6, 8, 10]
    assert bucket_names(edges, 1) == ["1-2", "3-4", "5-6", "7-8", "9-10"]
    assert assign_buckets(lengths, edges).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert length_edges(np.full(7, 3), 4) == [3]  # one length: one bucket
    assert bucket_names([3], 3) == ["3"]


def test_group_metrics_by_hand() -> None:
    ranks = np.array([1, 3, 11, 2])
    rows = group_metrics(ranks, np.array([0, 0, 1, 1]), ["a", "b", "empty"], k=10)
    assert rows[0] == {"group": "a", "users": 2, "HR@10": 1.0, "NDCG@10": 0.75}  # (1/log2(2) + 1/log2(4)) / 2
    assert rows[1]["HR@10"] == 0.5
    assert rows[1]["NDCG@10"] == pytest.approx(0.5 / math.log2(3), abs=1e-6)  # rank 11 is a miss
    assert rows[2] == {"group": "empty", "users": 0, "HR@10": None, "NDCG@10": None}


def test_breakdown_groups_users_by_data_alone() -> None:
    # Item 1 dominates training; the test split's inputs (history before the test target) have 3, 4 and 6 items.
    rows = [[1, 1, 2, 3], [1, 1, 3, 1, 2], [4, 1, 1, 1, 2, 1, 4]]
    split = leave_one_out(Sequences.from_lists(rows))
    ranks = {"m": np.array([1, 20, 2]), "n": np.array([5, 5, 5])}
    result = breakdown(ranks, split, n_items=4, head_share=0.5, edges=(2, 3, 99))
    # Training positions: [1, 1], [1, 1, 3], [4, 1, 1, 1, 2] -> item 1 has 7 of 10: the head alone.
    assert result["head"] == {"share": 0.5, "items": 1, "catalogue": 4, "interaction_share": 0.7}
    # Test targets 3, 2, 4: none is item 1, so every user is long tail.
    assert [r["users"] for r in result["popularity"]["models"]["m"]] == [0, 3]
    # 2 is below the shortest history (3) and 99 past the longest (6): the buckets are <= 3 and 4-6.
    assert result["length"]["edges"] == [3, 6]
    assert result["length"]["groups"] == ["3", "4-6"]
    m, n = result["length"]["models"]["m"], result["length"]["models"]["n"]
    assert [r["users"] for r in m] == [1, 2]
    assert m[0]["NDCG@10"] == 1.0  # user 0 (3 items), rank 1
    assert m[1]["HR@10"] == 0.5  # ranks 20 and 2
    assert [r["HR@10"] for r in n] == [1.0, 1.0]
