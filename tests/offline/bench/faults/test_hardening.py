"""`seqrec bench hardening`: its committed record holds what docs/RELIABILITY.md quotes and the command that wrote
it, and its log reading counts what each worker wrote (the bench itself runs servers: `seqrec bench hardening`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from offline.bench.faults.hardening import worker_logs
from offline.cli.seqrec import build_parser

ROOT = Path(__file__).resolve().parents[4]
RECORD = ROOT / "docs" / "results" / "reliability" / "hardening.json"
QUOTED = ["start_up.refused.no_key_off_loopback.message", "host_allow_list.foreign", "slow_clients.slow_clients",
          "slow_clients.steady_client_alone.latency_ms.p50",
          "slow_clients.steady_client_beside_slow_ones.latency_ms.p50",
          "connection_cap.status_at_cap", "connection_cap.idle_closed_with_408_by_the_deadline",
          "readiness.while_down", "readiness.event_503_body.detail", "readiness.logs.workers_logging_start_up_info"]


def _dotted(record: dict[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value[part]
    return value


def test_the_record_holds_what_the_docs_quote_and_its_command_parses() -> None:
    record = json.loads(RECORD.read_text())
    argv = shlex.split(record["command"])
    assert argv[:3] == ["seqrec", "bench", "hardening"]
    args = build_parser().parse_args(argv[1:])
    assert args.out == Path("docs/results/reliability/hardening.json")
    assert record["passed"] is True
    assert all(record["checks"].values())
    for key in QUOTED:
        assert _dotted(record, key) is not None, key
    assert "results/reliability/hardening.json" in (ROOT / "docs" / "RELIABILITY.md").read_text()


def test_worker_logs_count_each_workers_lines() -> None:
    def line(pid: int, level: str, message: str, logger: str = "seqrec.service") -> str:
        return json.dumps({"time": "t", "level": level, "logger": logger, "pid": pid, "message": message})

    log = "\n".join([line(1, "INFO", "serving v1 (lgbm) from x"), line(2, "INFO", "serving v1 (lgbm) from x"),
                     line(2, "WARNING", "history store unavailable: Redis at r is unreachable"),
                     line(1, "INFO", "GET /readyz 200", logger="uvicorn.access")])
    counted = worker_logs(log)
    assert (counted["workers_logging_start_up_info"], counted["workers_logging_the_outage_warning"]) == (2, 1)
    assert counted["ok"] is True
    assert worker_logs(log.split("\n", 1)[1])["ok"] is False  # one worker's start-up line lost
    assert worker_logs("WARNING seqrec.service: plain text\n" + log)["other_lines"] == [
        "WARNING seqrec.service: plain text"]
