"""Backtests under several seeds side by side (offline/backtest/seeds.py): ratios of the seed means and scratch's
seed spread, on hand-written steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offline.backtest.seeds import across_seeds, main


def _step(step: int, mode: str, ndcg: float, seconds: float, trained: str = "scratch") -> dict[str, Any]:
    return {"step": step, "mode": mode, "users": 50, "trained": trained, "train_seconds": seconds,
            "nightly": {"NDCG@10": ndcg}, "live": {"NDCG@10": ndcg * 2}}


def _report(seed: int, scratch: float, warm: float, warm_seconds: float) -> dict[str, Any]:
    return {"plan": {"train_seed": seed},
            "steps": [_step(0, "scratch", 0.05, 80.0), _step(0, "warm", 0.05, 80.0, "scratch (first bundle)"),
                      _step(1, "scratch", scratch, 100.0), _step(1, "warm", warm, warm_seconds, "warm")]}


def test_ratios_are_of_the_seed_means_and_the_spread_is_scratchs() -> None:
    table = across_seeds([_report(42, 0.10, 0.09, 20.0), _report(123, 0.08, 0.09, 40.0)])
    assert table["seeds"] == [42, 123]
    [row] = table["steps"]  # step 1 (index 0) served scratch's own bundle: not compared
    assert row["step"] == 1
    assert row["ndcg_ratio"] == pytest.approx(0.09 / 0.09)
    assert row["scratch_spread"] == pytest.approx(0.02 / 0.09)
    assert row["time_ratio"] == pytest.approx(30.0 / 100.0)
    assert row["met"] is True
    assert table["met"] == "1 of 1 steps"


def test_a_folder_without_a_backtest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "backtest.json").write_text(json.dumps(_report(42, 0.1, 0.1, 10.0)))
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 1
    assert "no backtest's folder" in capsys.readouterr().err
    assert main([str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 0
    assert "met on 1 of 1 steps" in (tmp_path / "out" / "seeds.md").read_text()


def test_a_stopped_run_counts_with_its_finished_steps(tmp_path: Path) -> None:
    done, stopped = tmp_path / "done", tmp_path / "stopped"
    done.mkdir()
    (done / "backtest.json").write_text(json.dumps(_report(42, 0.10, 0.09, 20.0)))
    (stopped / "steps").mkdir(parents=True)
    (stopped / "plan.json").write_text(json.dumps({"train_seed": 123}))
    for s in _report(123, 0.08, 0.09, 40.0)["steps"]:
        (stopped / "steps" / f"{s['step']:02d}-{s['mode']}.json").write_text(json.dumps(s))
    assert main([str(done), str(stopped), "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "seeds.json").read_text())
    assert table["seeds"] == [42, 123]
    assert table["met"] == "1 of 1 steps"
    (stopped / "steps" / "01-warm.json").unlink()  # killed during step 2's warm run: step 2 is not compared
    assert main([str(done), str(stopped), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "seeds.json").read_text())["met"] == "0 of 0 steps"
