"""Mining uses training positions only; features are the same offline and online."""

import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.jobs.mine import mine
from ranker.features import (
    COLUMN,
    DENSE_FEATURES,
    ID_DERIVED,
    FeatureBatch,
    compute_features,
)
from ranker.groups.similarity import HISTORY_GROUP_COST
from ranker.mining import training_groups
from ranker.tables import ItemTables
from ranker.train import FeatureSource, features, make_groups
from retriever.index import IndexSpec, build_index, normalize
from retriever.windows import length_groups, padded_slices

N_ITEMS = 12


def _split():  # type: ignore[no-untyped-def]
    # Items 11 and 12 are only ever validation or test targets.
    return leave_one_out(Sequences.from_lists([[1, 2, 3, 4, 11, 12], [5, 6, 7, 12, 11], [8, 9, 10, 1, 11, 12]]))


def test_training_groups_never_use_a_validation_or_test_target() -> None:
    split = _split()
    start, pos = training_groups(split.train.offsets, per_user=10)
    targets = split.train.items[pos]
    assert not set(targets.tolist()) & {11, 12}
    # Every group's history lies inside the same user's training items, before its target.
    owner = np.searchsorted(split.train.offsets, pos, side="right") - 1
    assert np.array_equal(start, split.train.offsets[owner])
    assert np.all(pos > start)
    # The last few training targets per user, most recent first.
    _start1, pos1 = training_groups(split.train.offsets, per_user=1)
    assert split.train.items[pos1].tolist() == [4, 7, 1]
    assert len(pos) == 3 + 2 + 3  # every training target with at least one item before it


def test_padded_slices_keep_the_most_recent_items() -> None:
    items = np.arange(1, 11)
    out = padded_slices(items, np.array([0, 5]), np.array([4, 10]), max_len=3)
    assert out.tolist() == [[2, 3, 4], [8, 9, 10]]
    assert padded_slices(items, np.array([0, 2]), np.array([1, 5])).tolist() == [[0, 0, 1], [3, 4, 5]]


def _vectors(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.nn.functional.normalize(torch.randn(N_ITEMS + 1, 8, generator=g), dim=-1)
    v[0] = 0
    return v


def _encode(vectors: torch.Tensor):  # type: ignore[no-untyped-def]
    def encode(history: torch.Tensor) -> torch.Tensor:  # mean of the history's item vectors
        summed = vectors[history].sum(1)
        return torch.nn.functional.normalize(summed, dim=-1)

    return encode


def test_mining_under_exclude_removes_the_whole_history_a_repeat_target_included() -> None:
    vectors = _vectors()
    index = build_index(normalize(vectors[1:].numpy()), IndexSpec())
    items = np.array([3, 5, 3, 7], dtype=np.int64)
    # Group 0: history [3, 5], target 3 (a repeat). Group 1: history [3, 5, 3], target 7.
    mined = mine(_encode(vectors), index, items, np.array([0, 0]), np.array([2, 3]), np.array([3, 7]),
                 depth=N_ITEMS, max_len=10)
    assert not {3, 5} & set(mined.candidates[0].tolist())  # the repeat target is unreachable: no positive
    assert not {3, 5} & set(mined.candidates[1].tolist())
    assert mined.label.tolist()[0] == -1
    assert mined.label[1] >= 0
    assert mined.recall() == 0.5
    assert (mined.candidates[0] != 0).sum() == N_ITEMS - 2
    assert np.all(np.diff(mined.scores[0][mined.candidates[0] != 0]) <= 1e-6)  # best first
    # The scores are the cosine of the encoder's user vector and the candidate's vector.
    user = _encode(vectors)(torch.tensor([[3, 5, 3]]))[0]
    c = mined.candidates[1][0]
    assert mined.scores[1][0] == pytest.approx(float(user @ vectors[c]), abs=1e-5)


def test_mining_under_allow_removes_nothing() -> None:
    vectors = _vectors()
    index = build_index(normalize(vectors[1:].numpy()), IndexSpec())
    items = np.array([3, 5, 3, 7], dtype=np.int64)
    mined = mine(_encode(vectors), index, items, np.array([0, 0]), np.array([2, 3]), np.array([3, 7]),
                 depth=N_ITEMS, max_len=10, exclude_seen=False)
    for row in mined.candidates:
        assert sorted(row.tolist()) == list(range(1, N_ITEMS + 1))  # every item, the history's included
    assert (mined.label >= 0).all()
    # The history's items compete on their score: 3 stands where its cosine with the user puts it.
    user = _encode(vectors)(torch.tensor([[3, 5]]))[0]
    expected = sorted(range(1, N_ITEMS + 1), key=lambda i: -float(user @ vectors[i]))
    assert mined.candidates[0].tolist().index(3) == expected.index(3)


def _tables() -> ItemTables:
    meta = np.zeros((N_ITEMS + 1, 2), dtype=np.int64)
    meta[1:, 0] = (np.arange(N_ITEMS) % 3) + 1  # values 1..3
    meta[1::2, 1] = 4
    years = np.array([np.nan] + [1990 + i for i in range(N_ITEMS)], dtype=np.float64)
    train_items = np.array([1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # 11 and 12 never in training
    offsets = np.array([0, 3, 6, 12])  # users: [1 1 1], [2 3 4], [5 6 7 8 9 10]
    return ItemTables.build(offsets, train_items, N_ITEMS, meta, years)


def test_item_tables_come_from_training_positions() -> None:
    tables = _tables()
    assert tables.popularity[1] == pytest.approx(1.0)
    assert tables.popularity[2] == pytest.approx(np.log1p(1) / np.log1p(3))
    assert tables.popularity[11] == 0.0
    assert not tables.known[11]
    assert tables.known[10]
    assert tables.year_bucket[0] == 0
    assert tables.year_bucket[1] == 1
    assert tables.year_bucket[6] == 2


def test_unknown_flag_zeroes_id_derived_columns_and_id_mask_does_the_same() -> None:
    tables, vectors = _tables().torch(), _vectors()
    history = torch.tensor([[0, 1, 2, 3]])
    user = _encode(vectors)(history)
    candidates = torch.tensor([[11, 5, 6, 0]])  # 11 is unknown, 0 is an empty slot
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.0]])
    batch = compute_features(tables, vectors, history, user, candidates, scores)
    unknown = batch.dense[..., COLUMN["is_unknown"]]
    assert unknown[0, :3].tolist() == [1.0, 0.0, 0.0]
    assert torch.all(batch.dense[0, 0, list(ID_DERIVED)] == 0)
    assert torch.all(batch.product[0, 0] == 0)
    assert torch.all(batch.dense[0, 3] == 0)  # empty slot: all zero
    assert batch.dense[0, 1, COLUMN["retrieval_score"]] == pytest.approx(0.8)
    masked = compute_features(tables, vectors, history, user, candidates, scores,
                              id_mask=torch.tensor([[False, True, False, False]]))
    assert masked.dense[0, 1, COLUMN["is_unknown"]] == 1.0
    assert torch.all(masked.dense[0, 1, list(ID_DERIVED)] == 0)
    assert torch.equal(masked.dense[0, 2], batch.dense[0, 2])  # unmasked candidates unchanged
    # Metadata and popularity survive masking: the fallback signal.
    keep = [COLUMN[n] for n in ("popularity", "meta_overlap", "meta_affinity", "year_bucket")]
    assert torch.equal(masked.dense[0, 1, keep], batch.dense[0, 1, keep])


def test_meta_and_history_similarity_by_hand() -> None:
    tables, vectors = _tables().torch(), _vectors()
    history = torch.tensor([[1, 2]])  # meta: item 1 -> (1, 4), item 2 -> (2, none)
    user = _encode(vectors)(history)
    batch = compute_features(tables, vectors, history, user, torch.tensor([[6, 5, 3]]),
                             torch.tensor([[0.5, 0.4, 0.3]]))
    # item 6 -> (3): not in the history; item 5 -> (2, 4): both, once each in 2 history items;
    # item 3 -> (3, 4): one of two values.
    assert batch.dense[0, 0, COLUMN["meta_overlap"]] == 0.0
    assert batch.dense[0, 1, COLUMN["meta_overlap"]] == 1.0
    assert batch.dense[0, 1, COLUMN["meta_affinity"]] == pytest.approx(0.5)
    assert batch.dense[0, 2, COLUMN["meta_overlap"]] == 0.5
    assert batch.dense[0, 2, COLUMN["meta_affinity"]] == pytest.approx(0.25)
    cos = vectors[5] @ vectors[torch.tensor([1, 2])].T
    assert batch.dense[0, 1, COLUMN["history_max_cos"]] == pytest.approx(float(cos.max()), abs=1e-6)
    assert batch.dense[0, 1, COLUMN["history_mean_cos"]] == pytest.approx(float(cos.mean()), abs=1e-6)
    assert batch.dense[0, 1, COLUMN["last_item_cos"]] == pytest.approx(float(cos[-1]), abs=1e-6)
    assert batch.dense[0, 0, COLUMN["score_gap"]] == 0.0
    assert batch.dense[0, 1, COLUMN["score_gap"]] == pytest.approx(0.1)
    assert batch.dense.shape == (1, 3, len(DENSE_FEATURES))


def test_offline_batches_and_online_single_requests_give_identical_features() -> None:
    """The trainer computes features for padded batches of groups; the service for one request."""
    tables, vectors = _tables().torch(), _vectors()
    index = build_index(normalize(vectors[1:].numpy()), IndexSpec())
    items = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3, 2], dtype=np.int64)
    start, end = np.array([0, 4, 0, 9]), np.array([3, 6, 9, 12])
    target = items[np.minimum(end, len(items) - 1)]
    encode = _encode(vectors)
    mined = mine(encode, index, items, start, end, target, depth=6, max_len=5)
    groups = make_groups(mined, items, max_len=5)
    offline = features(FeatureSource(tables, vectors), groups, np.arange(len(groups)))
    for g in range(len(groups)):
        history = torch.from_numpy(items[max(start[g], end[g] - 5) : end[g]])[None, :]  # unpadded, as a request
        candidates, scores = torch.from_numpy(mined.candidates[g : g + 1]), torch.from_numpy(mined.scores[g : g + 1])
        online = compute_features(tables, vectors, history, encode(history), candidates, scores)
        assert torch.allclose(offline.dense[g], online.dense[0], atol=1e-6)
        assert torch.allclose(offline.product[g], online.product[0], atol=1e-6)
        assert torch.equal(offline.meta[g], online.meta[0])


def test_follows_counts_by_hand_and_never_across_users() -> None:
    tables = _tables()  # training rows [1 1 1], [2 3 4], [5 6 7 8 9 10]; pairs within 3 steps
    torch_tables, vectors = tables.torch(), _vectors()
    history = torch.tensor([[2, 3], [0, 1]])
    user = _encode(vectors)(history)
    candidates = torch.tensor([[4, 5], [2, 1]])
    batch = compute_features(torch_tables, vectors, history, user, candidates, torch.zeros(2, 2))
    col = COLUMN
    assert batch.dense[0, 0, col["follows_last"]] == pytest.approx(np.log1p(1))  # 3 -> 4 once
    assert batch.dense[0, 0, col["follows_last_share"]] == pytest.approx(1.0)  # 3 is followed only by 4
    assert batch.dense[0, 0, col["follows_recent"]] == pytest.approx(np.log1p(2))  # 2 -> 4 and 3 -> 4
    assert batch.dense[0, 1, col["follows_last"]] == 0.0
    assert batch.dense[1, 0, col["follows_last"]] == 0.0  # 1 -> 2 would cross from one user to the next
    assert batch.dense[1, 1, col["follows_last"]] == pytest.approx(np.log1p(3))  # 1 -> 1: twice at lag 1, once at 2
    assert tables.follow_totals[2] == 2.0  # 2 -> 3, 2 -> 4


def _pinned_batch() -> FeatureBatch:
    """A seeded batch that exercises every column: unknown and masked candidates, an empty slot,
    a padded history, metadata and an item without a year."""
    rng = np.random.default_rng(7)
    n_items, n_users = 40, 30
    offsets = np.concatenate([[0], np.cumsum(rng.integers(2, 12, n_users))])
    items = rng.integers(1, n_items - 4, offsets[-1])  # the last items never occur in training: unknown
    meta = rng.integers(0, 6, (n_items + 1, 3))
    meta[0] = 0
    years = np.concatenate([[np.nan], rng.integers(1970, 2020, n_items).astype(float)])
    years[5] = np.nan
    tables = ItemTables.build(offsets, items, n_items, meta, years).torch()
    g = torch.Generator().manual_seed(7)
    vectors = torch.nn.functional.normalize(torch.randn(n_items + 1, 8, generator=g), dim=-1)
    vectors[0] = 0
    history = torch.randint(0, n_items + 1, (6, 9), generator=g)
    history[0, :4] = 0
    user = torch.nn.functional.normalize(torch.randn(6, 8, generator=g), dim=-1)
    candidates = torch.randint(1, n_items + 1, (6, 15), generator=g)
    candidates[1, -3:] = 0
    scores = torch.sort(torch.rand(6, 15, generator=g), descending=True).values
    mask = torch.rand(6, 15, generator=g) < 0.2
    return compute_features(tables, vectors, history, user, candidates, scores, id_mask=mask)


def test_feature_values_are_pinned() -> None:
    """The numbers computed before `compute_features` was split into helpers: a refactor that moves
    an operation (or a trained ranker's inputs drift) changes them."""
    batch = _pinned_batch()
    column_sums = [25.626287, 105.744505, 25.185194, 56.629922, 31.0, 32.647235, 1.031638, 2.553159, 0.193173, 87.0,
                   46.251853, 192.662521, 430.0, 235.888887, 13.235464, 1.645455, 44.951692]
    assert batch.dense.double().sum((0, 1)).tolist() == pytest.approx(column_sums, abs=2e-5)
    assert float(batch.product.double().sum()) == pytest.approx(-3.503989, abs=2e-5)
    assert float(batch.product.double().abs().sum()) == pytest.approx(38.506194, abs=2e-5)
    assert int(batch.meta.sum()) == 732
    assert int(batch.year_bucket.sum()) == 430
    row = [0.0, 0.0, 0.0, 0.9266284108161926, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.4444444477558136, 2.3025851249694824,
           3.0, 2.5555553436279297, 0.0, 0.0, 0.0]  # a masked candidate: ID-derived columns zeroed
    assert batch.dense[2, 3].tolist() == pytest.approx(row, abs=1e-6)


def test_histories_of_very_different_lengths_get_the_features_each_would_get_alone() -> None:
    """The history cosines run in length groups (`ranker.groups.similarity`): a row's values are
    bit for bit those of the same request alone, whichever group it landed in."""
    tables, vectors = _tables().torch(), _vectors()
    generator = torch.Generator().manual_seed(0)
    lengths = [60, 2, 60, 1, 33]
    assert len(length_groups(np.sort(lengths), HISTORY_GROUP_COST)) > 1  # the split path is the one tested
    rows = [torch.randint(1, N_ITEMS + 1, (n,), generator=generator) for n in lengths]
    history = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    for r, row in enumerate(rows):
        history[r, -len(row):] = row
    candidates = torch.randint(0, N_ITEMS + 1, (len(rows), 7), generator=generator)
    scores = torch.rand(len(rows), 7, generator=generator)
    encode = _encode(vectors)
    user = encode(history)
    batch = compute_features(tables, vectors, history, user, candidates, scores)
    for r, row in enumerate(rows):
        alone = compute_features(tables, vectors, row[None, :], user[r : r + 1], candidates[r : r + 1],
                                 scores[r : r + 1])
        assert torch.equal(batch.dense[r], alone.dense[0])
