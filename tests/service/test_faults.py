"""Faults under open-loop load against a real uvicorn process: short runs of the scenarios that
`offline.bench.faults.redis_faults`, `offline.bench.faults.bad_push` and `offline.bench.faults.soak` run at full
length. Redis is a redis-server of the test's own, killed with SIGKILL and restarted."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from common.errors import SeqrecError
from offline.bench.faults.bad_push import BREAKS, bad_push, broken_copy
from offline.bench.faults.redis_faults import redis_faults
from offline.bench.faults.soak import soak
from offline.bench.lib.load import Call, Marks, open_loop
from offline.bench.lib.payloads import load_catalogue
from offline.bench.lib.processes import RedisProcess
from offline.jobs.versions import switch_current
from tests import needs
from tests.service.support import Server, free_port, serving, train_bundle


def _explain(report: dict[str, Any]) -> str:
    failed = [name for name, ok in report["checks"].items() if not ok]
    return f"failed checks {failed}:\n{json.dumps(report, indent=1, default=str)[:6000]}"


@pytest.fixture
def redis_with_aof(tmp_path: Path) -> RedisProcess:
    needs.program("redis-server")
    return RedisProcess(free_port(), tmp_path / "redis")


def test_open_loop_runs_until_the_action_and_its_tail(api: Server) -> None:
    body = json.dumps({"history": ["i1", "i2"], "k": 3}).encode()

    async def action(session: Any, marks: Marks) -> str:
        import asyncio

        await asyncio.sleep(0.5)
        marks["halfway"] = time.perf_counter()
        return "done"

    run = open_loop(api.url, lambda i: Call("history", "POST", "/recommend", body), 40, action=action, tail_s=0.5)
    assert run.result == "done"
    assert 0.4 < run.marks["halfway"] - run.start < 0.7  # a 0.5 s sleep, loosely: the clock is read around it
    last_due = run.answers[-1].due - run.start
    assert 0.85 < last_due < 1.2
    assert len(run.answers) > 10
    assert all(a.status == 200 and a.error is None and a.due <= a.sent <= a.done for a in run.answers)

    async def failing(session: Any, marks: Marks) -> None:
        raise RuntimeError("the action broke")

    with pytest.raises(RuntimeError, match="the action broke"):
        open_loop(api.url, lambda i: Call("history", "POST", "/recommend", body), 40, action=failing, tail_s=5)


def test_redis_killed_and_restarted_under_load(bundle: Path, redis_with_aof: RedisProcess, tmp_path: Path) -> None:
    """History-carrying requests never fail; user_id-only requests and events get 503 while Redis is down and
    succeed again after its restart; every acknowledged event is in Redis afterwards."""
    with redis_with_aof, serving(tmp_path / "api", artifacts=str(bundle), redis_url=redis_with_aof.url,
                                 redis_timeout_ms="250") as api:
        report = redis_faults(api.url, redis_with_aof, load_catalogue(bundle).tolist(), rate=40, before_s=2.5,
                              down_s=2.0, after_s=2.5, seed=1)
    assert report["passed"], _explain(report)
    table = report["by_kind"]
    assert sum(table["history"][p]["sent"] for p in table["history"]) > 50
    assert table["history"]["outage"]["ok"] == table["history"]["outage"]["sent"] > 10
    for kind in ("user", "event"):
        assert table[kind]["outage"]["n_503"] == table[kind]["outage"]["sent"] > 3
        assert table[kind]["after"]["ok"] == table[kind]["after"]["sent"] > 3
        assert table[kind]["before"]["ok"] == table[kind]["before"]["sent"] > 3
    events = report["events"]
    assert events["lost"] == 0
    assert events["acknowledged_during_load"] > 20
    assert events["refused"] >= table["event"]["outage"]["sent"]
    # the seeded histories (acknowledged before the kill) came back from the append-only file
    assert events["held_by_redis"] >= events["acknowledged"]
    assert report["load"]["error_kinds"].keys() <= {"HTTP 503"}


def test_redis_faults_needs_a_persistent_redis(api: Server) -> None:
    needs.program("redis-server")
    with pytest.raises(SeqrecError, match="append-only file"):
        redis_faults(api.url, RedisProcess(free_port()), ["i1"], rate=1, before_s=1, down_s=1, after_s=1)


@pytest.fixture(scope="module")
def push_artifacts(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("push")
    bundles = {"root": root, "v1": Path(shutil.copytree(bundle, root / "v1")),
               "v2": train_bundle(prepared, root / "v2", seed=5, ranker=False)}
    for kind in BREAKS:
        broken_copy(bundles["v1"], root / kind, kind)
        bundles[kind] = root / kind
    switch_current(root, bundles["v1"])
    return bundles


def test_bad_pushes_refused_under_load(push_artifacts: dict[str, Path], tmp_path: Path) -> None:
    """Truncated, checksum-mismatched, shape-mismatched and incomplete bundles are each refused with their reason
    while the old model answers every request; then a good bundle replaces it, still without a failed request."""
    root, v1, v2 = push_artifacts["root"], push_artifacts["v1"], push_artifacts["v2"]
    broken = {kind: (push_artifacts[kind], reason) for kind, reason in BREAKS.items()}
    with serving(tmp_path / "api", artifacts=str(root)) as api:
        report = bad_push(api.url, root, v1, broken, v2, load_catalogue(v1).tolist(), rate=30, lead_s=1.0,
                          gap_s=0.5, tail_s=1.5)
    assert report["passed"], _explain(report)
    for kind, reason in BREAKS.items():
        push = report["pushes"][kind]
        assert push["http_status"] == 409
        assert reason in push["detail"]
    assert report["pushes"]["good"]["http_status"] == 200
    assert report["pushes"]["good"]["answer"]["status"] == "reloaded"
    assert report["load"]["errors"] == 0
    assert report["load"]["sent"] > 40
    # every answer before the good push came from the old model; every one after its reload from the new
    assert report["good"] != report["new"]
    assert set(report["versions_before_good_push"]) == {report["good"]}
    assert report["versions_before_good_push"][report["good"]] > 30
    assert set(report["versions_after_reload"]) == {report["new"]}
    assert report["versions_after_reload"][report["new"]] > 10
    assert (root / "current").resolve() == v2.resolve()


def test_broken_copy_leaves_the_source_alone(bundle: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file()}
    for kind in BREAKS:
        broken_copy(bundle, tmp_path / kind, kind)
    assert {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file()} == before
    assert (tmp_path / "truncated" / "retriever.pt").stat().st_size == (bundle / "retriever.pt").stat().st_size // 2
    assert (tmp_path / "checksum" / "items.faiss").read_bytes() != (bundle / "items.faiss").read_bytes()
    assert not (tmp_path / "incomplete" / "items.faiss").exists()
    with pytest.raises(SeqrecError, match="unknown break"):
        broken_copy(bundle, tmp_path / "other", "melted")


@pytest.mark.slow
def test_soak_one_minute(bundle: Path, tmp_path: Path) -> None:
    """offline/bench/faults/soak.py in small: one minute in two windows of 30 s (shorter ones hold too few requests
    for a steady p99); the second window's p99 within 20 % of the first's, RSS within 10 %, no error."""
    with serving(tmp_path / "api", artifacts=str(bundle)) as api:
        assert api.proc is not None
        report = soak(api.url, api.proc.pid, load_catalogue(bundle).tolist(), rate=20, minutes=1, window_s=30,
                      warmup_s=5)
    assert report["passed"], _explain(report)
    assert len(report["windows"]) == 2
    assert all(w["sent"] > 450 and w["errors"] == 0 and w["rss_mb"] > 50 for w in report["windows"])
