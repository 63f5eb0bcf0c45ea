"""The warm-start schedule chosen on the window before a backtest (offline/backtest/choose.py): the rule on
hand-written figures, the times it trains and scores on (never at or after --start), and, end to end on a tiny
drift set (`-m slow`), that the choice is the same when every interaction from --start on is removed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.errors import SeqrecError
from offline.backtest import choose
from offline.backtest.choose import candidates, choose_warm, pick
from offline.backtest.timeline import Timeline, load_timeline, parse_start
from offline.cli.seqrec import main
from offline.jobs.pipeline_config import load_pipeline_config

from .test_backtest import START, _config

DAY = 86_400.0


def _tried(*figures: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"ndcg": ndcg, "train_seconds": seconds} for ndcg, seconds in figures]


def test_the_fastest_candidate_meeting_both_halves_is_chosen() -> None:
    scratch = {"ndcg": 0.10, "train_seconds": 100.0}
    # 0: too slow; 1: quality short (0.097 < 0.098); 2 and 3 meet both, 3 is faster
    index, why = pick(scratch, _tried((0.12, 40.0), (0.097, 10.0), (0.099, 30.0), (0.098, 20.0)))
    assert index == 3
    assert "both" in why


def test_without_a_candidate_meeting_both_the_best_within_the_time_half() -> None:
    scratch = {"ndcg": 0.10, "train_seconds": 100.0}
    assert pick(scratch, _tried((0.12, 40.0), (0.090, 10.0), (0.095, 30.0)))[0] == 2
    assert pick(scratch, _tried((0.12, 40.0), (0.11, 50.0)))[0] == 0  # none fast enough: the best


def test_the_grid_scales_the_config_learning_rate_and_drops_the_warmup() -> None:
    grid = candidates(0.002)
    assert len(grid) == len({json.dumps(g, sort_keys=True) for g in grid}) == 6
    assert {g["train.lr"] for g in grid} == {0.001, 0.002}
    assert {g["train.epochs"] for g in grid} == {2, 4, 8}
    assert all(g["train.warmup_steps"] == 0 and g["train.patience"] <= g["train.epochs"] for g in grid)


def test_every_training_and_the_scored_window_end_at_the_start(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_pipeline_config(_config(tmp_path))
    timeline = load_timeline(config)
    start = parse_start(START)
    trained: list[tuple[float, str | None]] = []
    scored: list[tuple[float, float]] = []

    def train(cfg: Any, tl: Timeline, t: float, folder: Path, overrides: dict[str, Any], threads: int | None,
              warm_from: str | None) -> dict[str, Any]:
        trained.append((t, warm_from))
        return {"bundle": str(folder), "train_seconds": 100.0 if warm_from is None else 10.0 * len(trained)}

    def score(result: dict[str, Any], tl: Timeline, t0: float, t1: float, k: int) -> dict[str, Any]:
        scored.append((t0, t1))
        return {"ndcg": 0.1, "live_ndcg": 0.2, "users": 5, "events": 9, "train_seconds": result["train_seconds"]}

    monkeypatch.setattr(choose, "_train", train)
    monkeypatch.setattr(choose, "_score", score)
    choice = choose_warm(config, timeline, start, DAY, tmp_path / "choose", k=10, threads=1, overrides={})
    assert trained[0] == (start - 2 * DAY, None)  # the base: the "previous step" of the validation step
    assert trained[1] == (start - DAY, None)  # scratch at the validation step
    assert all(t == start - DAY and warm == str(tmp_path / "choose" / "base") for t, warm in trained[2:])
    assert len(trained) == 2 + len(candidates(0.001))
    assert set(scored) == {(start - DAY, start)}  # the window before the start, nothing after it
    assert choice["chosen"] == 0  # every candidate ties on NDCG; the first trained fastest (30 s)
    assert json.loads((tmp_path / "choose" / "choice.json").read_text()) == choice


def test_a_start_without_two_steps_before_it_is_refused(tmp_path: Path) -> None:
    config = load_pipeline_config(_config(tmp_path))
    timeline = load_timeline(config)
    with pytest.raises(SeqrecError, match="--choose-warm needs two steps of data before --start"):
        choose_warm(config, timeline, float(timeline.times[0]) + DAY, DAY, tmp_path / "c", k=10, threads=1,
                    overrides={})


def test_choose_warm_and_warm_choice_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    choice = tmp_path / "warm-choice.json"
    choice.write_text("{}")
    assert main(["backtest", "--config", str(_config(tmp_path)), "--start", START, "--steps", "1", "--out",
                 str(tmp_path / "out"), "--choose-warm", "--warm-choice", str(choice)]) == 1
    assert "not both" in capsys.readouterr().err


@pytest.mark.slow
def test_the_choice_is_blind_to_what_happens_from_the_start(tmp_path: Path) -> None:
    config = load_pipeline_config(_config(tmp_path))
    full = load_timeline(config)
    start = parse_start(START)
    n = full.before(start)
    cut = Timeline(users=full.users[:n], items=full.items[:n], times=full.times[:n], items_table=full.items_table,
                   resolution=full.resolution)
    seen = choose_warm(config, full, start, DAY, tmp_path / "full", k=10, threads=1, overrides={})
    blind = choose_warm(config, cut, start, DAY, tmp_path / "cut", k=10, threads=1, overrides={})
    assert n < len(full.times)
    for a, b in zip([seen["scratch"], *seen["candidates"]], [blind["scratch"], *blind["candidates"]], strict=True):
        assert (a["ndcg"], a["live_ndcg"], a["users"], a["events"]) == (b["ndcg"], b["live_ndcg"], b["users"],
                                                                          b["events"])
    assert np.isfinite(seen["scratch"]["ndcg"])
