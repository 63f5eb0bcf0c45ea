"""`python -m offline.bench.serve.shed` against a real server: each run's counts add up, and what the client saw
shed (503) is what the server counted in seqrec_shed_total."""

from __future__ import annotations

import json
from pathlib import Path

from offline.bench.serve.shed import main as shed


def test_the_shed_bench_counts_what_the_server_shed(bundle: Path, tmp_path: Path) -> None:
    assert shed(["--artifact", str(bundle), "--out", str(tmp_path), "--rates", "1500", "--queues", "1,1000000",
                 "--duration", "1.5", "--warmup", "0.5", "--requests", "50"]) == 0
    report = json.loads((tmp_path / "shed.json").read_text())
    runs = {r["max_queue"]: r for r in report["runs"]}
    assert sorted(runs) == [1, 1_000_000]
    for run in runs.values():
        assert run["sent"] == run["ok"] + run["errors"] > 0
        assert set(run["error_kinds"]) <= {"HTTP 503", "timeout"}
        assert run["readyz_after"] == 200
    # the bound sheds under 1,500 r/s on one worker; without one nothing is refused
    assert runs[1]["error_kinds"].get("HTTP 503", 0) > 0
    assert runs[1_000_000]["error_kinds"].get("HTTP 503", 0) == 0
    # the client's 503s over the whole run (warm-up included) are the server's count
    assert runs[1]["shed_by_server"] >= runs[1]["error_kinds"]["HTTP 503"]
    assert runs[1_000_000]["shed_by_server"] == 0
    text = (tmp_path / "shed.md").read_text()
    assert text.count("\n| 1 |") == 1
    assert text.count("\n| 1000000 |") == 1
