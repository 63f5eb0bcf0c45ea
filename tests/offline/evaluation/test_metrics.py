import math

import pytest
import torch

from offline.evaluation.metrics import full_ranking_metrics, pessimistic_ranks


def loop_rank(scores: list[float], target: int, exclude: set[int]) -> int:
    """Plain-Python reference: 1 + other ranked items (not padding, not excluded) scoring >= target."""
    return 1 + sum(
        1 for j, s in enumerate(scores) if j != 0 and j != target and j not in exclude and s >= scores[target]
    )


def test_hand_example_with_ties_and_exclusion():
    #                      pad  1    2    3    4    5
    scores = torch.tensor([[9.0, 0.5, 0.9, 0.5, 0.1, 0.7]])
    # Target 1 (0.5): items 2 (0.9) and 5 (0.7) score higher, item 3 ties -> pessimistic rank 4.
    assert pessimistic_ranks(scores, torch.tensor([1])).tolist() == [4]
    # Excluding item 2 (history) lifts it to rank 3; the padding column's 9.0 never counts.
    exclude = torch.zeros_like(scores, dtype=torch.bool)
    exclude[0, 2] = True
    assert pessimistic_ranks(scores, torch.tensor([1]), exclude).tolist() == [3]


def test_target_in_exclude_is_still_ranked():
    scores = torch.tensor([[0.0, 0.2, 0.9, 0.1]])
    exclude = torch.tensor([[False, True, True, False]])  # target 1 is in the history too
    assert pessimistic_ranks(scores, torch.tensor([1]), exclude).tolist() == [1]


def test_all_equal_scores_give_the_worst_rank():
    scores = torch.zeros(2, 11)
    ranks = pessimistic_ranks(scores, torch.tensor([3, 10]))
    assert ranks.tolist() == [10, 10]
    assert full_ranking_metrics(scores, torch.tensor([3, 10]), ks=(1, 5))["HR@5"] == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_parity_with_plain_loop_on_heavy_ties(seed):
    gen = torch.Generator().manual_seed(seed)
    B, N = 64, 40
    scores = torch.randint(0, 4, (B, N + 1), generator=gen).float()  # 4 distinct values: ties everywhere
    targets = torch.randint(1, N + 1, (B,), generator=gen)
    exclude = torch.rand(B, N + 1, generator=gen) < 0.3
    got = pessimistic_ranks(scores, targets, exclude)
    expected = [
        loop_rank(scores[b].tolist(), int(targets[b]), set(torch.nonzero(exclude[b]).flatten().tolist()))
        for b in range(B)
    ]
    assert got.tolist() == expected
    ks = (1, 5, 10)
    metrics = full_ranking_metrics(scores, targets, exclude, ks=ks)
    for k in ks:
        assert metrics[f"HR@{k}"] == pytest.approx(sum(r <= k for r in expected) / B)
        assert metrics[f"NDCG@{k}"] == pytest.approx(sum(1 / math.log2(r + 1) for r in expected if r <= k) / B)
        assert metrics[f"MRR@{k}"] == pytest.approx(sum(1 / r for r in expected if r <= k) / B)
    assert set(metrics) == {f"{m}@{k}" for m in ("HR", "NDCG", "MRR", "Recall") for k in ks}


def test_inputs_are_not_modified():
    scores = torch.rand(3, 6)
    exclude = torch.zeros(3, 6, dtype=torch.bool)
    before = scores.clone()
    pessimistic_ranks(scores, torch.tensor([1, 2, 3]), exclude)
    assert torch.equal(scores, before)
    assert not exclude.any()


@pytest.mark.parametrize(
    ("scores", "targets", "message"),
    [
        (torch.rand(2, 5), torch.tensor([0, 1]), "padding"),
        (torch.rand(2, 5), torch.tensor([1, 5]), r"\[1, n_items\]"),
        (torch.tensor([[0.0, float("nan"), 1.0]]), torch.tensor([1]), "NaN"),
        (torch.rand(2, 5), torch.tensor([1]), "expected scores"),
        (torch.ones(1, 3, dtype=torch.long), torch.tensor([1]), "floating"),
    ],
)
def test_bad_inputs_raise(scores, targets, message):
    with pytest.raises(ValueError, match=message):
        pessimistic_ranks(scores, targets)
