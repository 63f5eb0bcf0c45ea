"""`seqrec bench serve` end to end on the tiny bundle: real servers, real load, the written report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline.cli import main


def test_bench_serve_writes_the_service_and_noop_figures(bundle: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "bench"
    assert main(["bench", "serve", "--artifact", str(bundle), "--out", str(out), "--rates", "10,20",
                 "--check-rate", "10", "--duration", "1", "--warmup", "0.3", "--requests", "20",
                 "--min-len", "3", "--max-len", "8", "-q"]) == 0
    report = json.loads((out / "serve.json").read_text())
    target = report["targets"][bundle.name]
    assert target["catalogue"] > 0
    check = target["service"]["check"]
    assert check["errors"] == 0
    assert check["ok"] == check["sent"] > 0
    assert 0 < check["p50_ms"] <= check["p99_ms"]
    for side in ("service", "noop"):  # each sweep stepped through the rates it passed
        assert next(r["rate"] for r in target[side]["sweep"]) == 10
    answers = target["service"]["answers"]  # every body sent alone, against the in-process reference path
    assert answers["passed"]
    assert answers["identical_topk"] == answers["checked"] == 20
    assert target["service"]["cpu_ms_per_request"] > 0
    assert target["noop"]["memory_mb"]["pss"] > 0
    assert target["service"]["worker_shares"] == target["noop"]["worker_shares"] == [1.0]  # one worker did it all
    assert "max rate, p99 <= 50 ms" in (out / "serve.md").read_text()
    assert "no-op" in capsys.readouterr().out


def test_bench_serve_refuses_bad_rates(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "serve", "--artifact", str(bundle), "--out", str(tmp_path), "--rates", "0"]) == 1
    assert "--rates" in capsys.readouterr().err
