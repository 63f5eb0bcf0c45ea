"""The reliability benches write their report to --out with a command that parses again: their figures in
docs/RELIABILITY.md and the results pages were printed and never written to a file."""

from __future__ import annotations

import importlib
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from offline.bench.faults import training_faults
from offline.bench.faults.reliability import Started, print_report, recorded_command

BENCHES = {  # module -> the arguments the docs give it
    "redis_faults": ["--artifacts", "A", "--rate", "60", "--before", "20", "--down", "10", "--after", "20"],
    "bad_push": ["--artifacts", "A", "--rate", "50"],
    "training_faults": ["--config", "configs/pipeline/demo.yaml", "--work", "/tmp/faults"],
    "retrain_reload": ["--artifacts", "/tmp/rollout", "--config", "configs/pipeline/demo.yaml", "--rate", "50"],
}


@pytest.mark.parametrize("name", BENCHES)
def test_a_recorded_command_parses_back_to_its_arguments(name: str, tmp_path: Path) -> None:
    out = tmp_path / "a folder with spaces" / f"{name}.json"
    argv = [*BENCHES[name], "--out", str(out)]
    command = recorded_command(f"offline.bench.faults.{name}", argv)
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", f"offline.bench.faults.{name}"]
    args = importlib.import_module(f"offline.bench.faults.{name}").parser().parse_args(words[3:])
    assert args.out == out


def test_the_report_is_printed_and_written_with_its_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    out = tmp_path / "new" / "report.json"
    report: dict[str, Any] = {"scenario": "x", "load": {"sent": 3}, "checks": {"ok": True}, "passed": True}
    argv = ["--artifacts", "A", "--note", "two words", "--out", str(out)]
    assert print_report(report, "offline.bench.faults.redis_faults", argv, out, **Started().head(), bundle="B") == 0
    written = json.loads(out.read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert shlex.split(written["command"]) == ["python", "-m", "offline.bench.faults.redis_faults", *argv]
    assert (written["load"], written["bundle"]) == ({"sent": 3}, "B")
    assert written["date"]
    assert written["machine"]["cpus"] == os.cpu_count()
    assert written["seconds"] >= 0
    assert [p.name for p in out.parent.iterdir()] == ["report.json"]  # no temp file left beside it

    failed = {**report, "passed": False}
    assert print_report(failed, "offline.bench.faults.redis_faults", argv, out) == 1
    assert json.loads(out.read_text())["passed"] is False  # a failed run is recorded too


def test_training_faults_writes_its_report_to_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def measured(config: Path, work: Path, tolerance: float) -> dict[str, Any]:
        return {"config": str(config), "tolerance": tolerance, "reference": {"valid_ndcg@10": 0.5},
                "kill_during_training": {"valid_ndcg@10": 0.5}, "passed": True}

    monkeypatch.setattr(training_faults, "training_faults", measured)
    out = tmp_path / "training-faults.json"
    assert training_faults.main(["--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["kill_during_training"]["valid_ndcg@10"] == written["reference"]["valid_ndcg@10"]
    assert shlex.split(written["command"])[3:] == ["--work", str(tmp_path / "work"), "--out", str(out)]
