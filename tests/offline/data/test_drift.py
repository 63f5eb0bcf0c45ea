"""The synthetic generator's clock with drift (offline/data/readers/drift.py): a period of days, items arriving,
popularity moving, users coming and going, a sequential signal; deterministic per seed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from offline.cli.seqrec import main
from offline.data.prepared import load_prepared
from offline.data.readers.base import ITEM, TIME, USER, RawDataset
from offline.data.readers.drift import DAY
from offline.data.readers.synthetic import SyntheticConfig, generate

DRIFT = SyntheticConfig(n_users=1500, n_items=300, mean_length=20, days=28, seed=3)


@pytest.fixture(scope="module")
def drift() -> RawDataset:
    return generate(DRIFT)


def _columns(data: RawDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = data.interactions
    return (np.asarray(t[USER].to_pylist()), np.asarray(t[ITEM].to_pylist()), t[TIME].to_numpy())


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data(drift: RawDataset) -> None:
    assert generate(DRIFT).interactions.equals(drift.interactions)
    other = generate(SyntheticConfig(n_users=1500, n_items=300, mean_length=20, days=28, seed=4))
    assert not other.interactions.equals(drift.interactions)


def test_timestamps_cover_the_period_and_rows_are_chronological_per_user(drift: RawDataset) -> None:
    users, _, times = _columns(drift)
    start = times.min()
    assert times.max() - start < DRIFT.days * DAY
    assert times.max() - start > (DRIFT.days - 1) * DAY  # the whole period is used
    same = users[1:] == users[:-1]
    assert (np.diff(times)[same] >= 0).all()
    per_day = np.bincount(((times - start) // DAY).astype(np.int64))
    assert len(per_day) == DRIFT.days
    assert per_day.min() > 0


def test_items_arrive_over_the_period(drift: RawDataset) -> None:
    _, items, times = _columns(drift)
    day = (times - times.min()) // DAY
    first: dict[str, int] = {}
    for i in np.argsort(times, kind="stable"):
        first.setdefault(items[i], int(day[i]))
    late = sum(d >= 7 for d in first.values())
    assert late > 0.25 * len(first), f"only {late} of {len(first)} items first appear after the first week"


def test_popularity_shifts_from_the_first_week_to_the_last(drift: RawDataset) -> None:
    """At least half of the first week's 20 most frequent items are out of the last week's."""
    _, items, times = _columns(drift)
    day = (times - times.min()) // DAY
    head = [{i for i, _ in Counter(items[(day >= lo) & (day < lo + 7)].tolist()).most_common(20)}
            for lo in (0, DRIFT.days - 7)]
    assert len(head[0] & head[1]) <= 10, f"the top 20 items of the first and last week share {head[0] & head[1]}"


def test_users_arrive_and_leave(drift: RawDataset) -> None:
    users, _, times = _columns(drift)
    start = times.min()
    bounds = np.flatnonzero(np.r_[True, users[1:] != users[:-1], True])
    first, last = times[bounds[:-1]] - start, times[bounds[1:] - 1] - start
    assert (first > DRIFT.days * DAY / 2).mean() > 0.3  # a third of the users arrive in the second half
    assert (last < DRIFT.days * DAY / 2).mean() > 0.2  # and a fifth are gone by then
    assert np.median(last - first) < DRIFT.days * DAY / 2


def test_the_previous_item_predicts_the_next_far_better_than_popularity(drift: RawDataset) -> None:
    """The signal is sequential: the most frequent successor of the previous item (counted on the first half of
    the users) names the next item of the other half over four times as often than the most popular item does."""
    users, items, _ = _columns(drift)
    same = users[1:] == users[:-1]
    prev, nxt, who = items[:-1][same], items[1:][same], users[1:][same]
    fit = np.array([int(u[1:]) % 2 == 0 for u in who])
    follows: dict[str, Counter[str]] = {}
    for p, n in zip(prev[fit], nxt[fit], strict=True):
        follows.setdefault(p, Counter())[n] += 1
    top = Counter(nxt[fit].tolist()).most_common(1)[0][0]
    held = ~fit
    by_sequence = np.mean([follows[p].most_common(1)[0][0] == n if p in follows else False
                           for p, n in zip(prev[held], nxt[held], strict=True)])
    by_popularity = np.mean(nxt[held] == top)
    assert by_sequence > 4 * by_popularity, (by_sequence, by_popularity)
    assert by_sequence > 0.1


def test_without_days_the_generator_is_unchanged() -> None:
    plain = SyntheticConfig(n_users=200, n_items=60, mean_length=10, seed=5)
    times = generate(plain).interactions[TIME].to_numpy()
    assert times.max() - times.min() > 300 * DAY  # the old clock: users start within a year, no period


@pytest.mark.parametrize(("options", "message"), [
    ({"days": -1}, "days must be >= 0"),
    ({"days": 5, "new_item_share": 1.0}, "new_item_share must be in [0, 1)"),
    ({"days": 5, "popularity_half_life": 0}, "popularity_half_life must be > 0"),
])
def test_bad_drift_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        SyntheticConfig(**options)


def test_seqrec_prepare_takes_days(tmp_path: Path) -> None:
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "100", "--n-items", "40", "--days", "5",
                 "--out", str(tmp_path / "data")]) == 0
    times = load_prepared(tmp_path / "data").sequences.timestamps
    assert times is not None
    assert 4 * DAY < times.max() - times.min() < 5 * DAY
