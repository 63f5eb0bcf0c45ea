import numpy as np
import torch

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.evaluation.evaluate import evaluate_splits, target_ranks
from retriever.popularity import Popularity


def test_counts_come_from_training_positions_only():
    #           train     valid test
    rows = [[1, 1, 2, 3, 4], [2, 2, 4, 4]]
    split = leave_one_out(Sequences.from_lists(rows))
    model = Popularity.fit(split.train.items, n_items=4)
    assert model.counts.tolist() == [0, 2, 3, 0, 0]  # items 3 and 4 only ever appear as targets


def test_hand_checked_ranks_with_history_excluded_and_pessimistic_ties():
    # Training counts: item1 = 3, item2 = 2, item3 = 2, item4 = 0, item5 = 0.
    rows = [[1, 1, 1, 2, 5, 4], [2, 3, 3, 4, 5]]
    split = leave_one_out(Sequences.from_lists(rows))
    model = Popularity.fit(split.train.items, n_items=5)
    # User 0 valid target 5 (count 0), history {1, 2}: ranked against 3 (2), 4 (0) -> rank 3 (tie with 4).
    # User 1 valid target 4 (count 0), history {2, 3}: ranked against 1 (3), 5 (0) -> rank 3.
    ranks = target_ranks(model.score, split.inputs("valid"), split.valid_targets, 5)
    assert ranks.tolist() == [3, 3]
    # Test: user 0 target 4, history {1, 2, 5}: against 3 (2) -> rank 2; user 1 target 5, history
    # {2, 3, 4}: against 1 (3) -> rank 2.
    ranks = target_ranks(model.score, split.inputs("test"), split.test_targets, 5)
    assert ranks.tolist() == [2, 2]


def test_streaming_batch_size_does_not_change_results():
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(1, 30, size=rng.integers(3, 15))) for _ in range(101)]
    split = leave_one_out(Sequences.from_lists(rows))
    model = Popularity.fit(split.train.items, n_items=29)
    one = evaluate_splits(model.score, split, 29, batch_size=1)
    many = evaluate_splits(model.score, split, 29, batch_size=1000)
    odd = evaluate_splits(model.score, split, 29, batch_size=7)
    assert one == many == odd


def test_padding_scores_minus_infinity():
    model = Popularity(torch.tensor([0.0, 5.0, 1.0]))
    scores = model.score(torch.zeros(2, 3, dtype=torch.long))
    assert scores.shape == (2, 3)
    assert scores[0, 0] == float("-inf")
