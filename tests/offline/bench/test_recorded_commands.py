"""The commands the warm-start result files record parse again: their notes were joined unquoted (`--note ML-100K,
configs/...`), which the bench's own parser refused (`unrecognized arguments`). The reliability records
(docs/results/reliability/) hold the figures the docs quote and the command that wrote them."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from offline.bench.train import warm_start

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "warm-start"
# the committed records were written before the benches were grouped by what they measure, and keep the module path
# they ran as: offline.bench.<name>, now offline.bench.train.warm_start and offline.bench.faults.<name>
RECORDED_AS = "offline.bench"


@pytest.mark.parametrize("record", sorted(RESULTS.rglob("results.json")), ids=lambda p: str(p.parent.name))
def test_a_recorded_warm_start_command_parses(record: Path) -> None:
    command = json.loads(record.read_text())["command"]
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", f"{RECORDED_AS}.warm_start"]
    args = warm_start.parser().parse_args(argv[3:])
    assert len(args.note) >= 2
    assert f"`{command}`" in (record.parent / "results.md").read_text()


RELIABILITY = RESULTS.parent / "reliability"
# file -> the bench that wrote it, and the keys (dotted) docs/RELIABILITY.md and docs/benchmarks/reliability.md quote
RELIABILITY_RECORDS = {
    "redis-faults.json": ("redis_faults", ["rate", "fault.kill_at_s", "fault.down_s", "fault.load_s", "load.sent",
                                           "by_kind.history.all.ok", "by_kind.history.all.errors",
                                           "by_kind.user.outage.n_503", "by_kind.event.outage.n_503",
                                           "events.acknowledged", "events.lost", "events.refused_but_stored",
                                           "checks.only_2xx_or_503", "checks.store_requests_ok_before_and_after"]),
    "bad-push.json": ("bad_push", ["rate", "load.sent", "load.errors", "load.p99_ms", "versions_before_good_push",
                                   "versions_after_reload", "pushes.truncated.detail", "pushes.checksum.detail",
                                   "pushes.shapes.detail", "pushes.incomplete.detail", "pushes.good.http_status"]),
    "training-faults.json": ("training_faults", ["config", "tolerance", "reference.valid_ndcg@10",
                                                 "kill_during_training.seconds_after_first_checkpoint",
                                                 "kill_during_training.current_intact",
                                                 "kill_during_training.resumed_training",
                                                 "kill_during_training.valid_ndcg@10",
                                                 "kill_during_publish.current_intact", "kill_during_publish.switched"]),
    "retrain-reload.json": ("retrain_reload", ["rate", "load_seconds", "pipeline_seconds", "reload.seconds",
                                               "during.sent", "during.errors", "during.window_s",
                                               "during.p99_ms_lowest_window", "during.p99_ms_highest_window",
                                               "after_reload.sent", "after_reload.errors", "after_reload.p99_ms"]),
}


def _dotted(record: dict[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize("name", RELIABILITY_RECORDS)
def test_a_reliability_record_holds_what_the_docs_quote_and_its_command_parses(name: str) -> None:
    """RELIABILITY rows 2, 3 and 4a and the retrain-under-load figures (once the README's, now the reliability results
    page's) were printed, never written."""
    module, keys = RELIABILITY_RECORDS[name]
    record = json.loads((RELIABILITY / name).read_text())
    argv = shlex.split(record["command"])
    assert argv[:3] == ["python", "-m", f"{RECORDED_AS}.{module}"]
    args = importlib.import_module(f"offline.bench.faults.{module}").parser().parse_args(argv[3:])
    assert args.out == Path("docs/results/reliability") / name
    assert record["passed"] is True
    for key in keys:
        assert _dotted(record, key) is not None, key
    assert f"results/reliability/{name}" in (RESULTS.parents[1] / "RELIABILITY.md").read_text() + (
        RESULTS.parents[1] / "benchmarks" / "reliability.md").read_text()


def test_the_fuzz_record_holds_what_the_docs_quote_and_its_command_parses() -> None:
    record = json.loads((RELIABILITY / "fuzz.json").read_text())
    argv = shlex.split(record["command"])
    assert argv[:3] == ["SEQREC_FUZZ_OUT=docs/results/reliability/fuzz.json", "pytest", "tests/service/test_fuzz.py"]
    assert argv[argv.index("-m") + 1] == "slow"
    assert (record["responses_5xx"], record["schemathesis_findings"]) == (0, 0)
    assert record["requests"] == sum(record["by_status"].values()) == sum(r["requests"] for r in record["runs"])
    assert "GET /items" in record["operations"]
    assert "results/reliability/fuzz.json" in (RESULTS.parents[1] / "RELIABILITY.md").read_text()
