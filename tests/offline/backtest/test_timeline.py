"""The backtest's clock: steps and starts parsed, the data's resolution, and the plans refused before training."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import SeqrecError
from offline.backtest.replay import Event, stored_window
from offline.backtest.timeline import Timeline, check_plan, clock_resolution, parse_start, parse_step

DAY = 86_400.0


def _timeline(times: list[float]) -> Timeline:
    n = len(times)
    return Timeline(users=np.array([f"u{i % 3}" for i in range(n)], dtype=object),
                    items=np.array([f"i{i}" for i in range(n)], dtype=object),
                    times=np.asarray(times, dtype=np.float64), items_table=None,
                    resolution=clock_resolution(np.asarray(times, dtype=np.float64)))


@pytest.mark.parametrize(("text", "seconds"), [("1d", DAY), ("7d", 7 * DAY), ("12h", 43_200), ("30m", 1800),
                                           ("3600s", 3600), ("90", 90), ("1w", 7 * DAY), ("0.5d", DAY / 2)])
def test_steps_parse(text: str, seconds: float) -> None:
    assert parse_step(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1d", "1y", "day", "1 d 2"])
def test_bad_steps_are_refused(text: str) -> None:
    with pytest.raises(SeqrecError, match="--step"):
        parse_step(text)


def test_starts_parse_as_utc_dates_or_seconds() -> None:
    assert parse_start("1998-03-01") == 888_710_400.0
    assert parse_start("1998-03-01T12:00:00+02:00") == 888_710_400.0 + 10 * 3600
    assert parse_start("888710400") == 888_710_400.0
    with pytest.raises(SeqrecError, match="--start"):
        parse_start("March 1st")


def test_the_clock_resolution_is_the_largest_unit_dividing_every_timestamp() -> None:
    assert clock_resolution(np.array([0.0, DAY, 5 * DAY])) == DAY
    assert clock_resolution(np.array([3600.0, 7200.0, 4 * 3600.0])) == 3600
    assert clock_resolution(np.array([60.0, 61.0])) == 1
    assert clock_resolution(np.array([0.5, 0.75, 1.0])) == 0.25  # a finer clock: the smallest gap


def test_a_good_plan_gives_its_windows() -> None:
    timeline = _timeline([i * DAY for i in range(10)])
    assert check_plan(timeline, 5 * DAY, DAY, 3) == [(5 * DAY, 6 * DAY), (6 * DAY, 7 * DAY), (7 * DAY, 8 * DAY)]


@pytest.mark.parametrize(("start", "step", "steps", "message"), [
    (0.0, DAY, 1, "outside the data"),  # nothing before the first step
    (-DAY, DAY, 1, "outside the data"),
    (20 * DAY, DAY, 1, "outside the data"),
    (8 * DAY, DAY, 3, "holds no interaction"),  # the third window is past the end
    (5 * DAY, 3600, 2, "shorter than the data's clock resolution"),
    (5 * DAY, DAY, 0, "--steps must be >= 1"),
])
def test_bad_plans_are_refused(start: float, step: float, steps: int, message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        check_plan(_timeline([i * DAY for i in range(10)]), start, step, steps)


def test_a_gap_in_the_data_is_an_empty_window() -> None:
    timeline = _timeline([0.0, DAY, 2 * DAY, 9 * DAY])
    with pytest.raises(SeqrecError, match=r"step 2 of 3: the window .* holds no interaction"):
        check_plan(timeline, 2 * DAY, DAY, 3)


def test_the_stored_window_skips_a_repeated_item_at_the_same_time_and_keeps_the_newest() -> None:
    events = [Event("a", 1.0), Event("b", 2.0), Event("a", 2.0), Event("b", 2.0), Event("a", 3.0)]
    assert stored_window(events, 10) == [Event("a", 1.0), Event("b", 2.0), Event("a", 2.0), Event("a", 3.0)]
    assert stored_window(events, 2) == [Event("a", 2.0), Event("a", 3.0)]


def test_the_http_check_keeps_to_the_service_request_limits() -> None:
    from offline.backtest import http_check
    from service.http import schemas

    assert http_check.EVENTS_PER_REQUEST == schemas.MAX_EVENTS
    assert http_check.MAX_HISTORY == schemas.MAX_HISTORY
