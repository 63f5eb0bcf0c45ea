"""The temporal metrics on a hand-made split and a fixed scorer, the expected figures written out."""

import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.data.temporal import temporal_split
from offline.evaluation.temporal import scorer_ranks, temporal_metrics, window_recall

CUT_10, CUT_20 = "1970-01-01T00:00:10+00:00", "1970-01-01T00:00:20+00:00"


def sequences(rows: list[list[tuple[int, int]]]) -> Sequences:
    base = Sequences.from_lists([[item for item, _ in row] for row in rows])
    return Sequences(base.offsets, base.items, np.array([t for row in rows for _, t in row], dtype=np.int64))


# 6 items; the scorer ranks them 6 > 5 > 4 > 3 > 2 > 1 for everyone.
SCORES = torch.tensor([float("-inf"), 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def fixed(histories: torch.Tensor) -> torch.Tensor:
    return SCORES.expand(histories.shape[0], -1)


@pytest.fixture
def split():
    return temporal_split(sequences([
        [(1, 1), (6, 12), (2, 13), (5, 21)],   # valid window: 6 then 2; test: 5
        [(2, 2), (3, 15), (4, 25)],            # valid window: 3; test: 4
        [(6, 11), (1, 22)],                    # cold in validation; test: 1
        [(1, 3), (2, 4)],                      # training only
    ]), CUT_10, CUT_20)


def test_window_recall_ranks_each_window_item_against_every_item(split):
    ranks_of = scorer_ranks(fixed, 6, exclude_seen=True)
    # user 0 (history {1}): 6 is rank 1, 2 is rank 5 -> Recall@1 = 1/2, Recall@5 = 2/2
    # user 1 (history {2}): 3 ranks behind 6, 5, 4 -> rank 4: Recall@1 = 0, Recall@5 = 1
    recall = window_recall(split.valid, ranks_of, (1, 5), "valid window")
    assert recall == {"Recall@1": 0.25, "Recall@5": 1.0}


def test_headline_and_apart(split):
    result = temporal_metrics(split, scorer_ranks(fixed, 6, exclude_seen=True), ks=(1, 5))
    # valid targets: 6 (rank 1) and 3 (rank 4, history {2} removed)
    assert result["valid"]["HR@1"] == 0.5
    assert result["valid"]["HR@5"] == 1.0
    valid = result["temporal"]["valid"]
    assert valid["users"] == 2
    assert valid["cold_users"] == 1
    assert valid["new_item_targets"] == 2  # items 6 and 3 are first seen after t = 10
    assert valid["known_item_target_metrics"] is None
    # test: user 0 target 5 (history {1, 6, 2}: rank 1), user 1 target 4 (history {2, 3}: 6, 5 ahead -> 3),
    # user 2 target 1 (history {6}: 5, 4, 3, 2 ahead -> rank 5)
    assert result["test"]["HR@1"] == pytest.approx(1 / 3, abs=1e-6)
    assert result["test"]["HR@5"] == 1.0
    test = result["temporal"]["test"]
    assert test["users"] == 3
    assert test["cold_users"] == 0
    assert test["new_item_targets"] == 2  # items 5 and 4: first seen at 21 and 25
    assert test["new_item_target_metrics"]["HR@1"] == 0.5
    assert test["known_item_target_metrics"]["HR@1"] == 0.0
    assert test["known_item_target_metrics"]["HR@5"] == 1.0
