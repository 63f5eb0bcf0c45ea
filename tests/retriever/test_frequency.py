import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.evaluation.evaluate import evaluate_splits, target_ranks
from retriever.frequency import PersonalFrequency
from retriever.popularity import Popularity


def _order(scores: torch.Tensor) -> list[int]:
    """Item ids (padding left out) from the highest score down; equal scores keep id order."""
    row = scores[0, 1:].tolist()
    return [int(i) + 1 for i in sorted(range(len(row)), key=lambda i: (-row[i], i))]


def test_history_first_by_count_then_popularity_for_the_rest():
    # Training counts: item1 = 1, item2 = 4, item3 = 3, item4 = 2, item5 = 0, item6 = 5.
    model = PersonalFrequency(Popularity(torch.tensor([0, 1, 4, 3, 2, 0, 5])))
    scores = model.score(torch.tensor([[0, 0, 1, 4, 1, 3, 4]]))  # counts: item1 = 2, item4 = 2, item3 = 1
    # item1 and item4 twice (popularity breaks the tie: 4 before 1), item3 once, then 6, 2, 5 by popularity.
    assert _order(scores) == [4, 1, 3, 6, 2, 5]
    assert scores[0, 0] == float("-inf")


def test_decay_favours_recent_items():
    model = PersonalFrequency(Popularity(torch.tensor([0, 1, 4, 3, 2, 0, 5])), decay=0.5)
    # Weights: item1 = 0.5**4 + 0.5**2 = 0.3125, item4 = 0.5**3 + 0.5**0 = 1.125, item3 = 0.5**1 = 0.5.
    scores = model.score(torch.tensor([[0, 0, 1, 4, 1, 3, 4]]))
    assert _order(scores) == [4, 3, 1, 6, 2, 5]
    weights = model.weights(torch.tensor([[0, 0, 1, 4, 1, 3, 4]]))
    assert weights[0, [1, 3, 4]].tolist() == pytest.approx([0.3125, 0.5, 1.125])


def test_equal_scores_stay_tied_and_the_tie_break_survives_float32():
    # Counts far apart in size: float32 scores of 2 + weight + 1e-3 * count / max would merge 1000 and 1001.
    counts = torch.zeros(6, dtype=torch.long)
    counts[1:] = torch.tensor([1000, 1001, 7, 7, 0])
    model = PersonalFrequency(Popularity(counts))
    history = torch.tensor([[1, 2] * 300])  # both 300 times
    scores = model.score(history)
    assert scores.dtype == torch.float32
    assert scores[0, 2] > scores[0, 1] > scores[0, 3] == scores[0, 4] > scores[0, 5]


def test_with_history_excluded_it_is_the_popularity_baseline():
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(1, 30, size=rng.integers(3, 15))) for _ in range(80)]
    split = leave_one_out(Sequences.from_lists(rows))
    frequency = PersonalFrequency.fit(split.train.items, 29, decay=0.7)
    popularity = Popularity.fit(split.train.items, 29)
    assert evaluate_splits(frequency.score, split, 29) == evaluate_splits(popularity.score, split, 29)
    allowed = evaluate_splits(frequency.score, split, 29, exclude_seen=False)
    assert allowed != evaluate_splits(popularity.score, split, 29, exclude_seen=False)


def test_hand_checked_ranks_with_repeats_allowed():
    # Training positions: user 0 [1, 2, 2], user 1 [3, 3, 3, 1]: counts item1 = 2, item2 = 2, item3 = 3.
    rows = [[1, 2, 2, 2, 4], [3, 3, 3, 1, 3, 2]]
    split = leave_one_out(Sequences.from_lists(rows))
    model = PersonalFrequency.fit(split.train.items, n_items=4)
    # Valid: user 0 history [1, 2, 2] -> 2, 1, then 3, 4: target 2 is first. User 1 history [3, 3, 3, 1] ->
    # 3, 1, then 2, 4: target 3 is first.
    valid = target_ranks(model.score, split.inputs("valid"), split.valid_targets, 4, exclude_seen=False)
    assert valid.tolist() == [1, 1]
    # Test: user 0 history [1, 2, 2, 2] -> 2, 1, 3, 4: target 4 is last (4). User 1 [3, 3, 3, 1, 3] -> 3, 1, 2:
    # target 2 is third.
    test = target_ranks(model.score, split.inputs("test"), split.test_targets, 4, exclude_seen=False)
    assert test.tolist() == [4, 3]


def test_refuses_a_decay_outside_zero_one():
    with pytest.raises(ValueError, match="decay"):
        PersonalFrequency(Popularity(torch.tensor([0, 1])), decay=0.0)
