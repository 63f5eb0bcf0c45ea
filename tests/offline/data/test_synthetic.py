from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from offline.data.readers.base import ITEM, TIME, USER, RawDataset
from offline.data.readers.synthetic import SyntheticConfig, _preferred_clusters, generate, genre_names

IntArray = npt.NDArray[np.int64]
SMALL = SyntheticConfig(n_users=300, n_items=120, n_clusters=6, mean_length=12, max_length=40)


@pytest.fixture(scope="module")
def default_data() -> RawDataset:
    return generate(SyntheticConfig())


def item_codes(data: RawDataset) -> IntArray:
    """Row of each interaction's item in the items table (-1 if absent)."""
    assert data.items is not None
    codes = pc.index_in(data.interactions[ITEM], value_set=data.items[ITEM])
    return codes.fill_null(-1).to_numpy().astype(np.int64)


def user_bounds(data: RawDataset) -> IntArray:
    """Start row of each user's run, plus the row count at the end."""
    users = data.interactions[USER].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.concatenate([[True], users[1:] != users[:-1]]))
    return np.append(starts, len(users)).astype(np.int64)


def same_user_pairs(data: RawDataset) -> npt.NDArray[np.bool_]:
    """[i] is True when rows i and i + 1 belong to the same user."""
    is_pair = np.ones(data.interactions.num_rows - 1, dtype=bool)
    is_pair[user_bounds(data)[1:-1] - 1] = False
    return is_pair


# --- shape and schema -------------------------------------------------------------


def test_schema_and_metadata(default_data: RawDataset) -> None:
    data = default_data
    assert data.source == "synthetic"
    assert data.has_timestamps
    assert data.files == []
    schema = data.interactions.schema
    assert schema.field(USER).type == pa.string()
    assert schema.field(ITEM).type == pa.string()
    assert schema.field(TIME).type == pa.int64()
    assert data.items is not None
    assert data.items.num_rows == 500
    assert data.items.schema.field("year").type == pa.int32()
    assert data.items.schema.field("genres").type == pa.list_(pa.string())
    assert data.items.slice(0, 2).to_pylist()[0]["item_id"] == "i1"
    assert data.items["title"][16].as_py() == "Item 17"
    assert data.items[ITEM][16].as_py() == "i17"


def test_every_item_is_in_the_items_table(default_data: RawDataset) -> None:
    assert default_data.items is not None
    assert pc.count_distinct(default_data.items[ITEM]).as_py() == default_data.items.num_rows
    assert (item_codes(default_data) >= 0).all()


def test_genres_are_known_names_primary_first() -> None:
    data = generate(replace(SMALL, n_clusters=25, n_items=200, secondary_genre_probability=0.5))
    assert data.items is not None
    names = set(genre_names(25))
    assert "Genre 21" in names
    assert len(names) == 25
    lists = data.items["genres"].to_pylist()
    assert all(1 <= len(g) <= 2 and set(g) <= names and len(set(g)) == len(g) for g in lists)
    assert 0.35 < np.mean([len(g) == 2 for g in lists]) < 0.65


def test_users_are_grouped_and_lengths_bounded(default_data: RawDataset) -> None:
    bounds = user_bounds(default_data)
    lengths = np.diff(bounds)
    users = default_data.interactions[USER].to_numpy(zero_copy_only=False)[bounds[:-1]]
    assert users.tolist() == [f"u{k}" for k in range(1, 2001)]  # one run per user, in order
    assert lengths.min() >= 5
    assert lengths.max() <= 200
    assert lengths.sum() == default_data.interactions.num_rows


def test_mean_length_matches_clipped_shifted_geometric(default_data: RawDataset) -> None:
    cfg = SyntheticConfig()
    k = np.arange(cfg.min_length, cfg.max_length + 1)
    p = 1 / (cfg.mean_length - cfg.min_length + 1)
    pmf = p * (1 - p) ** (k - cfg.min_length)
    pmf[-1] = (1 - p) ** (cfg.max_length - cfg.min_length)  # the clipped tail
    expected = float((k * pmf).sum())
    lengths = np.diff(user_bounds(default_data))
    assert abs(lengths.mean() - expected) < 4 * lengths.std() / np.sqrt(len(lengths))


def test_fixed_length_gives_exact_row_count() -> None:
    data = generate(replace(SMALL, min_length=7, mean_length=7, max_length=7))
    assert data.interactions.num_rows == 300 * 7
    assert set(np.diff(user_bounds(data)).tolist()) == {7}


# --- timestamps ---------------------------------------------------------------------


def test_timestamps_non_decreasing_with_ties_near_probability(default_data: RawDataset) -> None:
    times = default_data.interactions[TIME].to_numpy()
    gaps = np.diff(times)[same_user_pairs(default_data)]
    assert (times > 0).all()
    assert (gaps >= 0).all()
    tie_rate = (gaps == 0).mean()
    assert abs(tie_rate - 0.05) < 5 * np.sqrt(0.05 * 0.95 / len(gaps))


@pytest.mark.parametrize(("tie_probability", "expected"), [(0.0, False), (1.0, True)])
def test_tie_probability_extremes(tie_probability: float, expected: bool) -> None:
    data = generate(replace(SMALL, tie_probability=tie_probability))
    gaps = np.diff(data.interactions[TIME].to_numpy())[same_user_pairs(data)]
    assert ((gaps == 0) == expected).all()


# --- determinism ----------------------------------------------------------------------


def test_same_seed_same_tables() -> None:
    a, b = generate(SMALL), generate(SMALL)
    assert a.interactions.equals(b.interactions)
    assert a.items is not None
    assert a.items.equals(b.items)


def test_different_seeds_differ() -> None:
    a, b = generate(SMALL), generate(replace(SMALL, seed=1))
    assert not a.interactions.equals(b.interactions)
    assert a.items is not None
    assert not a.items.equals(b.items)


# --- the generative structure -------------------------------------------------------


def primary_genres(data: RawDataset) -> npt.NDArray[np.object_]:
    assert data.items is not None
    primary = pc.list_element(data.items["genres"], 0).to_numpy(zero_copy_only=False)
    return primary[item_codes(data)]


def test_pure_successor_walk_stays_in_one_cluster() -> None:
    data = generate(replace(SMALL, p_next=1.0, p_cluster=0.0))
    genres = primary_genres(data)
    pairs = same_user_pairs(data)
    assert (genres[:-1][pairs] == genres[1:][pairs]).all()


def test_pure_jumps_stay_in_preferred_clusters() -> None:
    data = generate(replace(SMALL, p_next=0.0, p_cluster=0.0, clusters_per_user=2))
    genres = primary_genres(data)
    per_user = [len(set(genres[a:b])) for a, b in zip(user_bounds(data)[:-1], user_bounds(data)[1:], strict=True)]
    assert max(per_user) <= 2
    assert np.mean(np.array(per_user) == 2) > 0.9  # two distinct clusters, and both get used


def test_preferred_clusters_are_drawn_by_mass_without_replacement() -> None:
    mass = np.array([0.5, 0.2, 0.2, 0.1])
    cfg = SyntheticConfig(n_users=100_000, n_items=10, n_clusters=4, clusters_per_user=2)
    picks = _preferred_clusters(cfg, mass, np.random.default_rng(0))
    observed = np.bincount(picks[:, 0] * 4 + picks[:, 1], minlength=16).reshape(4, 4) / cfg.n_users
    expected = mass[:, None] * mass[None, :] / (1 - mass[:, None])  # P(first = a) * P(second = b | a)
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(observed, expected, atol=0.005)


def test_preferred_clusters_terminate_with_zero_mass_clusters() -> None:
    cfg = SyntheticConfig(n_users=50, n_items=10, n_clusters=5, clusters_per_user=5)
    picks = _preferred_clusters(cfg, np.array([1.0, 0.0, 0.0, 1e-300, 0.0]), np.random.default_rng(0))
    assert (np.sort(picks, axis=1) == np.arange(5)).all()


def test_popularity_is_zipf_like(default_data: RawDataset) -> None:
    counts = np.sort(np.bincount(item_codes(default_data), minlength=500))[::-1]
    top_share = counts[:50].sum() / counts.sum()
    bottom_share = counts[250:].sum() / counts.sum()
    assert top_share > 2 * bottom_share


def hit_rate_at_10(scores: npt.NDArray[np.float64], targets: IntArray, seen: npt.NDArray[np.bool_]) -> float:
    """HR@10 with history excluded (the target never is) and ties counted against it."""
    target_scores = scores[np.arange(len(targets)), targets]
    excluded = seen.copy()
    excluded[np.arange(len(targets)), targets] = True
    ahead = ((scores >= target_scores[:, None]) & ~excluded).sum(axis=1)
    return float(np.mean(1 + ahead <= 10))


def markov_and_popularity_hr(data: RawDataset, n_items: int) -> tuple[float, float]:
    """Both baselines trained on every sequence minus its last item, scored on that item."""
    codes = item_codes(data)
    bounds = user_bounds(data)
    last = bounds[1:] - 1
    train = np.ones(len(codes), dtype=bool)
    train[last] = False
    pair = same_user_pairs(data) & train[1:]
    transitions = np.bincount(codes[:-1][pair] * n_items + codes[1:][pair], minlength=n_items * n_items)
    markov = transitions.reshape(n_items, n_items).astype(np.float64)
    popularity = np.bincount(codes[train], minlength=n_items).astype(np.float64)

    users = np.repeat(np.arange(len(last)), np.diff(bounds))
    seen = np.zeros((len(last), n_items), dtype=bool)
    seen[users[train], codes[train]] = True
    targets = codes[last]
    markov_hr = hit_rate_at_10(markov[codes[last - 1]], targets, seen)
    popularity_hr = hit_rate_at_10(np.broadcast_to(popularity, seen.shape), targets, seen)
    return markov_hr, popularity_hr


def test_hit_rate_counts_ties_against_the_target() -> None:
    scores = np.array([[1.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
    seen = np.array([[False, False, False], [True, False, False]])
    # Row 0: item 1 ties item 0 -> rank 2. Row 1: item 0 is history -> item 2 ranks 2.
    assert hit_rate_at_10(scores, np.array([1, 2]), seen) == 1.0
    big = np.zeros((1, 20))
    assert hit_rate_at_10(big, np.array([3]), np.zeros((1, 20), dtype=bool)) == 0.0  # 20-way tie


@pytest.mark.parametrize("seed", range(5))
def test_markov_beats_popularity_by_a_wide_margin(seed: int) -> None:
    markov_hr, popularity_hr = markov_and_popularity_hr(generate(SyntheticConfig(seed=seed)), 500)
    assert markov_hr >= 2 * popularity_hr
    assert markov_hr > 0.3


# --- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_items": 1}, "n_items must be >= 2"),
        ({"n_users": 0}, "n_users must be >= 1"),
        ({"n_clusters": -1}, "n_clusters must be in"),
        ({"n_clusters": 501}, "n_clusters must be in"),
        ({"clusters_per_user": 21}, "clusters_per_user must be in"),
        ({"min_length": 0}, "lengths must satisfy"),
        ({"mean_length": 4}, "lengths must satisfy"),
        ({"mean_length": 201}, "lengths must satisfy"),
        ({"min_length": 10, "max_length": 9, "mean_length": 9}, "lengths must satisfy"),
        ({"p_next": -0.1}, "p_next must be in"),
        ({"p_cluster": 1.5}, "p_cluster must be in"),
        ({"tie_probability": 1.01}, "tie_probability must be in"),
        ({"secondary_genre_probability": -1.0}, "secondary_genre_probability must be in"),
        ({"p_next": 0.8, "p_cluster": 0.3}, r"p_next \+ p_cluster must be <= 1"),
        ({"zipf_exponent": -1.0}, "zipf_exponent must be >= 0"),
        ({"successor_window": 0}, "successor_window must be >= 1"),
    ],
)
def test_invalid_config_raises(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticConfig(**changes)


def test_tiny_catalog_works() -> None:
    data = generate(SyntheticConfig(n_users=20, n_items=2, n_clusters=2, clusters_per_user=2, mean_length=6))
    assert set(data.interactions[ITEM].to_pylist()) <= {"i1", "i2"}
    assert (item_codes(data) >= 0).all()


def test_the_cluster_count_follows_a_small_catalogue() -> None:
    """`seqrec prepare --dataset synthetic --n-items 10` failed on n_clusters 20, which the CLI cannot set."""
    assert SyntheticConfig().n_clusters == 20  # the data every test and the demo use is unchanged
    assert SyntheticConfig(n_items=10).n_clusters == 10
    assert SyntheticConfig(n_items=10, n_clusters=4).n_clusters == 4
    assert generate(SyntheticConfig(n_users=50, n_items=10)).items.num_rows == 10
