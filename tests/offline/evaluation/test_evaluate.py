"""Streamed evaluation: walking the catalogue in item blocks gives exactly the full-matrix ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.evaluation.evaluate import chunked_target_ranks, summarize, target_ranks


def _case(seed: int, n_users: int = 60, n_items: int = 97, dim: int = 6) -> tuple[Sequences, np.ndarray, torch.Tensor,
                                                                                   torch.Tensor]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, n_users)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    items = rng.integers(1, n_items + 1, offsets[-1]).astype(np.int64)
    targets = rng.integers(1, n_items + 1, n_users).astype(np.int64)
    targets[:5] = items[offsets[1:6] - 1]  # a few targets repeat the user's last item: misses under exclude
    # Quarter-integers: every dot product is exact in float32 whatever the summation order, so both paths see
    # the same scores and ties are real ties (with arbitrary floats two orders may differ in the last bit).
    vectors = torch.from_numpy(rng.integers(-8, 9, (n_items + 1, dim)).astype(np.float32) / 4)
    vectors[10:30] = vectors[40]  # 21 identical items: exact ties, which must count against the target
    users = torch.from_numpy(rng.integers(-8, 9, (n_users, dim)).astype(np.float32) / 4)
    return Sequences(offsets, items), targets, vectors, users


@pytest.mark.parametrize("exclude_seen", [True, False])
@pytest.mark.parametrize("item_chunk", [1, 7, 40, 98, 1000])
@pytest.mark.parametrize("batch_size", [1, 16, 1024])
def test_chunked_ranks_equal_the_full_matrix_ranks(item_chunk: int, batch_size: int, exclude_seen: bool) -> None:
    inputs, targets, vectors, users = _case(seed=item_chunk + batch_size)
    # The encoder reads each user's id from a marker: the user's row in the batch is its first history item's
    # position, so map histories back to user rows through a lookup built from the padded matrix.
    padded = inputs.padded(np.arange(len(inputs)))
    key = {tuple(row.tolist()): u for u, row in enumerate(padded)}

    def encode(history: torch.Tensor) -> torch.Tensor:
        width = padded.shape[1]
        rows = [key[tuple([0] * (width - h.shape[0]) + h.tolist())] for h in history]
        return users[rows]

    def scorer(history: torch.Tensor) -> torch.Tensor:
        scores = encode(history) @ vectors.T / 0.5
        scores[:, 0] = -torch.inf
        return scores

    n_items = vectors.shape[0] - 1
    expected = target_ranks(scorer, inputs, targets, n_items, batch_size=batch_size, exclude_seen=exclude_seen)
    got = chunked_target_ranks(encode, vectors, inputs, targets, scale=0.5, batch_size=batch_size,
                               item_chunk=item_chunk, exclude_seen=exclude_seen)
    np.testing.assert_array_equal(got, expected)
    assert (expected[:5] == n_items + 1).all() == exclude_seen  # the repeat targets
    # The tie block is in play: some target sits inside the 21 identical items and ranks behind all of them.
    tied = np.isin(targets, np.r_[10:30, 40])
    assert tied.any()


def test_chunked_ranks_refuse_nan_and_bad_targets() -> None:
    inputs, targets, vectors, users = _case(seed=0)
    vectors[50, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        chunked_target_ranks(lambda h: users[: len(h)], vectors, inputs, targets, item_chunk=16)
    targets[3] = 0
    with pytest.raises(ValueError, match="internal ids"):
        chunked_target_ranks(lambda h: users[: len(h)], vectors, inputs, targets, item_chunk=16)


def test_take_keeps_the_chosen_users_sequences_and_timestamps() -> None:
    seqs = Sequences(np.array([0, 2, 5, 6]), np.array([1, 2, 3, 4, 5, 6]), np.array([10, 11, 20, 21, 22, 30]))
    part = seqs.take(np.array([2, 0]))
    assert part.to_lists() == [[6], [1, 2]]
    assert part.timestamps is not None
    assert part.timestamps.tolist() == [30, 10, 11]
    assert seqs.take(np.array([], dtype=np.int64)).to_lists() == []


def test_evaluation_sample_is_fixed_per_seed_and_a_subset_of_the_users() -> None:
    from offline.data.split import leave_one_out
    from offline.evaluation.retriever import evaluation_sample

    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 50, rng.integers(3, 9)).tolist() for _ in range(100)]
    split = leave_one_out(Sequences.from_lists(rows))
    assert evaluation_sample(split, None, 0) is split
    assert evaluation_sample(split, 500, 0) is split
    a, b = evaluation_sample(split, 30, 7), evaluation_sample(split, 30, 7)
    assert len(a.full) == 30
    assert a.full.to_lists() == b.full.to_lists()
    assert a.full.to_lists() != evaluation_sample(split, 30, 8).full.to_lists()
    chosen = [rows.index(r) for r in a.full.to_lists()]  # every sampled user is one of the originals
    assert a.valid_targets.tolist() == [rows[u][-2] for u in chosen]
    assert a.test_targets.tolist() == [rows[u][-1] for u in chosen]
    assert a.train.to_lists() == [rows[u][:-2] for u in chosen]


# Three users over 6 items whose scores are the item ids (item 6 best). Histories and targets by hand:
#   user 0: history [6, 2], target 6 (a repeat of the best item)
#   user 1: history [5, 1], target 3 (fresh; 6 and 4 score above it)
#   user 2: history [4],    target 4 (a repeat)
HAND_INPUTS = Sequences(np.array([0, 2, 4, 5]), np.array([6, 2, 5, 1, 4]))
HAND_TARGETS = np.array([6, 3, 4])


def _by_id(history: torch.Tensor) -> torch.Tensor:
    return torch.arange(7, dtype=torch.float32).expand(len(history), 7).clone()


@pytest.mark.parametrize(("exclude_seen", "expected"), [
    (True, [7, 3, 7]),  # the history is removed (5 for user 1: 6 and 4 stay ahead); a repeat target is a miss
    (False, [1, 4, 3]),  # nothing is removed: every item competes, history items included
])
def test_the_repeat_policy_decides_what_is_ranked(exclude_seen: bool, expected: list[int]) -> None:
    ranks = target_ranks(_by_id, HAND_INPUTS, HAND_TARGETS, 6, exclude_seen=exclude_seen)
    assert ranks.tolist() == expected
    vectors = torch.arange(7, dtype=torch.float32)[:, None]  # (7, 1): user . item = item id

    def encode(history: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(history), 1)

    chunked = chunked_target_ranks(encode, vectors, HAND_INPUTS, HAND_TARGETS, item_chunk=3, exclude_seen=exclude_seen)
    assert chunked.tolist() == expected
    metrics = summarize(ranks, (1, 5))
    assert metrics["HR@5"] == pytest.approx(1 / 3 if exclude_seen else 1.0)  # under exclude 2 of 3 are misses
