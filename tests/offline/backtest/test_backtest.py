"""`seqrec backtest` end to end on a tiny drift set: two steps trained, published, replayed in process and checked
over HTTP against a real server; resume after a kill (those run ~30 CPU-seconds: `-m slow`); bad input refused
before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline.cli.seqrec import main

START = "2020-09-19"  # the tiny set's clock starts 2020-09-13 and runs 9 days


def _config(folder: Path) -> Path:
    (folder / "retriever.yaml").write_text(
        "model: {backbone: transformer, max_len: 20, d_model: 16, n_layers: 1, n_heads: 1}\n"
        "train: {batch_size: 128, epochs: 3, patience: 1, seed: 42}\n")
    path = folder / "pipeline.yaml"
    path.write_text("name: tiny\n"
                    "data:\n  dataset: synthetic\n"
                    "  synthetic: {n_users: 300, n_items: 80, mean_length: 12, days: 9, seed: 1}\n"
                    "retriever: retriever.yaml\n"
                    "ranker: {kind: none}\n")
    return path


def _backtest(config: Path, out: Path, *more: str) -> int:
    return main(["backtest", "--config", str(config), "--start", START, "--step", "1d", "--out", str(out),
                 "--http-sample", "3", "--threads", "1", *more])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("backtest")
    config = _config(folder)
    assert _backtest(config, folder / "out", "--steps", "2", "--mode", "scratch") == 0
    return config, folder / "out"


@pytest.mark.slow
def test_every_step_is_trained_replayed_and_checked_over_http(finished: tuple[Path, Path]) -> None:
    _, out = finished
    report = json.loads((out / "backtest.json").read_text())
    steps = report["steps"]
    assert [(s["step"], s["mode"]) for s in steps] == [(0, "scratch"), (1, "scratch")]
    assert steps[0]["train_rows"] < steps[1]["train_rows"]  # the second step trains on the first one's window too
    for s in steps:
        assert s["users"] > 0
        assert s["events"] >= s["users"]
        assert s["nightly"]["n"] == s["users"]
        assert s["live"]["n"] == s["events"] == s["nightly_all"]["n"]
        for figures in (s["nightly"], s["nightly_all"], s["live"]):
            assert 0.0 <= figures["NDCG@10"] <= figures["HR@10"] <= 1.0
        assert s["http"]["users"] == 3
        assert s["http"]["lists"] > 3
        assert s["http"]["differ"] == 0
        assert 0.0 < s["coverage"]["nightly"] <= 1.0
        assert s["new_items"]["recommended_share"] == 0.0  # a bundle knows only the items trained on
        assert Path(s["bundle"]).is_dir()
    table = (out / "backtest.md").read_text()
    assert "| 1 | 2020-09-19T00:00:00Z | scratch |" in table
    assert "| 2 | 2020-09-20T00:00:00Z | scratch |" in table
    assert "HTTP parity: 0 of " in table
    assert (out / "backtest.png").stat().st_size > 0


@pytest.mark.slow
def test_a_killed_backtest_resumes_after_its_last_finished_step(finished: tuple[Path, Path]) -> None:
    config, out = finished
    first, second = out / "steps" / "00-scratch.json", out / "steps" / "01-scratch.json"
    kept = first.read_text()
    second.unlink()  # killed during the second step
    assert _backtest(config, out, "--steps", "2", "--mode", "scratch") == 0
    assert first.read_text() == kept  # not run again
    assert json.loads(second.read_text())["step"] == 1


@pytest.mark.slow
def test_a_folder_of_another_plan_is_refused(finished: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, out = finished
    assert _backtest(config, out, "--steps", "1", "--mode", "scratch") == 1
    assert "another plan (steps differ)" in capsys.readouterr().err


@pytest.mark.parametrize(("changed", "message"), [
    ({"--start": "2020-09-01"}, "is outside the data"),
    ({"--start": "2021-01-01"}, "is outside the data"),
    ({"--steps": "30"}, "holds no interaction"),
    ({"--step": "0.5s"}, "shorter than the data's clock resolution"),
    ({"--start": "2020-09-13T13:30:00"}, "nothing to train on"),
    ({"--budget-minutes": "0"}, "--budget-minutes must be > 0"),
])
def test_bad_input_is_refused_before_any_training(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  changed: dict[str, str], message: str) -> None:
    flags = {"--config": str(_config(tmp_path)), "--start": START, "--step": "1d", "--steps": "2",
             "--out": str(tmp_path / "out"), **changed}
    assert main(["backtest", *(part for flag, value in flags.items() for part in (flag, value))]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "artifacts").exists()


def test_a_folder_that_is_no_backtest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert _backtest(_config(tmp_path), tmp_path / "out", "--steps", "1") == 1
    assert "no plan.json" in capsys.readouterr().err
