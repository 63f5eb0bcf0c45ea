"""The open-loop load client (`offline.bench.lib.load`) against real uvicorn processes: the no-op app, one that
always fails, and one that blocks its event loop for 50 ms a request (to show that latency counts from the due time)."""

from __future__ import annotations

import gc
import math
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from common.errors import SeqrecError
from offline.bench.lib.load import Answer, Call, LoadResult, due_times, quiet_collector, run_load, summarise
from offline.bench.lib.payloads import payloads_from_catalogue, payloads_from_dataset
from offline.bench.lib.processes import (
    ServerError,
    free_port,
    process_cpu_seconds,
    start_server,
    start_server_process,
    worker_shares,
)
from offline.bench.lib.sweeps import geometric_rates, max_sustained_rate, report_table
from offline.bench.serve.serve import NOOP_APP
from offline.data.prepared import PreparedDataset
from offline.data.sequences import Sequences

ROOT = Path(__file__).resolve().parents[4]
# the test apps below live in this module: the server process must be able to import it
TEST_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
PAYLOADS = [{"history": ["1", "2", "3"], "k": 10, "candidates": 200, "rerank": True}]


def failing_app() -> FastAPI:
    """POST /recommend always answers 500; /readyz is ready."""
    app = FastAPI()

    @app.post("/recommend")
    async def recommend() -> JSONResponse:
        return JSONResponse({"detail": "boom"}, status_code=500)

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app


def slow_app() -> FastAPI:
    """POST /recommend blocks the event loop 50 ms: at most 20 requests/s, one at a time."""
    app = FastAPI()

    @app.post("/recommend")
    async def recommend() -> dict[str, str]:
        time.sleep(0.05)  # deliberately blocking: the server serialises requests
        return {}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app


def busy_app() -> FastAPI:
    """POST /recommend holds the CPU for 3 ms: work a worker's CPU time shows."""
    app = FastAPI()

    @app.post("/recommend")
    async def recommend() -> dict[str, str]:
        end = time.thread_time() + 0.003
        while time.thread_time() < end:
            pass
        return {}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app


def never_ready_app() -> FastAPI:
    app = FastAPI()

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        return JSONResponse({"status": "loading"}, status_code=503)

    return app


@pytest.fixture(scope="module")
def noop_url():
    with start_server(NOOP_APP, TEST_ENV) as url:
        yield url


@pytest.fixture(scope="module")
def failing_url():
    with start_server("tests.offline.bench.lib.test_load:failing_app", TEST_ENV) as url:
        yield url


# --------------------------------------------------------------------------- against real servers


def test_noop_server_at_50_per_second(noop_url):
    result = run_load(noop_url, PAYLOADS, rate=50, duration_s=2.0, warmup_s=0.5, arrivals="uniform")
    assert 90 <= result.sent <= 110
    assert result.ok == result.sent
    assert result.errors == 0
    assert result.error_kinds == {}
    assert 0 < result.p50_ms <= result.p95_ms <= result.p99_ms <= result.max_ms
    assert result.throughput == pytest.approx(50, rel=0.1)
    assert result.passes(p99_ms=2000)  # no error, answers measured; the 50 ms target is the benches' to judge


def test_poisson_arrivals_send_about_rate_times_duration(noop_url):
    result = run_load(noop_url, PAYLOADS, rate=200, duration_s=1.0, warmup_s=0.2, seed=3)
    assert result.sent == pytest.approx(200, rel=0.2)  # seeded: the same count every run
    assert result.errors == 0
    assert result.ok == result.sent


def test_server_errors_are_counted_not_raised(failing_url):
    result = run_load(failing_url, PAYLOADS, rate=40, duration_s=1.0, warmup_s=0.0, arrivals="uniform")
    assert result.sent == 40
    assert result.ok == 0
    assert result.errors == 40
    assert result.error_kinds == {"HTTP 500": 40}
    assert math.isnan(result.p99_ms)
    assert not result.passes()


def test_closed_port_counts_connection_errors():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_load(url, PAYLOADS, rate=20, duration_s=1.0, warmup_s=0.0, arrivals="uniform")
    assert result.sent == 20
    assert result.errors == 20
    assert result.error_kinds == {"connect": 20}


def test_latency_counts_from_the_due_time_not_the_answer_of_the_previous_request():
    # 40 requests offered at 40/s to a server that handles 20/s: an open-loop client keeps sending on
    # schedule and the queue shows up in the latencies; a closed-loop one would report ~50 ms each.
    with start_server("tests.offline.bench.lib.test_load:slow_app", TEST_ENV) as url:
        result = run_load(url, PAYLOADS, rate=40, duration_s=1.0, warmup_s=0.0, arrivals="uniform", timeout_s=5.0)
    assert result.errors == 0
    assert result.ok == 40
    assert result.send_lag_p99_ms < 400  # the client sent on time (a closed-loop one would lag ~1 s) ...
    assert result.max_ms > 700  # ... and the last request waited behind ~39 x 50 ms minus its own 975 ms offset
    assert result.p50_ms > 200
    assert result.throughput < 25


def test_max_sustained_rate_steps_up_and_stops_at_the_first_failure(noop_url, failing_url):
    # the stepping is under test, not the machine's latency: a p99 bound no busy CI runner misses (a 50 ms one
    # failed there once on a single slow answer of ~20); the failing app fails by its errors
    found = max_sustained_rate(noop_url, PAYLOADS, [40, 20], duration_s=0.5, warmup_s=0.2, p99_ms=2000)
    assert found.rate == 40
    assert [result.rate for result in found.results] == [20, 40]

    failed = max_sustained_rate(failing_url, PAYLOADS, [20, 40, 80], duration_s=0.5, warmup_s=0.0)
    assert failed.rate is None
    assert len(failed.results) == 1


def test_worker_shares_of_a_two_worker_server_cover_both_workers() -> None:
    with start_server_process("tests.offline.bench.lib.test_load:busy_app", TEST_ENV, workers=2) as server:
        before = process_cpu_seconds(server.pid)
        result = run_load(server.url, PAYLOADS, rate=100, duration_s=1.0, warmup_s=0.2, arrivals="uniform")
        shares = worker_shares(before, process_cpu_seconds(server.pid), server.pid)
    assert result.errors == 0
    assert len(shares) == 2  # the two workers, not the supervisor or multiprocessing's resource tracker
    assert shares[0] >= shares[1] >= 0  # largest first
    assert sum(shares) == pytest.approx(1, abs=0.01)


def test_worker_shares_of_one_process() -> None:
    me = os.getpid()
    assert worker_shares({me: 1.0}, {me: 3.0}, me) == [1.0]  # no spawned workers: the process itself
    # one process did whatever was done, even when it used less than a clock tick (the test's no-op server)
    assert worker_shares({me: 1.0}, {me: 1.0}, me) == [1.0]


def test_start_server_reports_a_broken_app_with_its_output():
    with pytest.raises(ServerError, match="exited with code") as info, start_server("no_such_module:app", TEST_ENV):
        pass
    assert "no_such_module" in str(info.value)


def test_start_server_times_out_when_never_ready():
    with pytest.raises(ServerError, match="not ready"), start_server(
            "tests.offline.bench.lib.test_load:never_ready_app", TEST_ENV, ready_timeout_s=1.5):
        pass


# --------------------------------------------------------------------------- pure parts


def outcome(due: float, sent: float, done: float, error: str | None) -> Answer:
    """One POST /recommend's times and error (what ``summarise`` reads)."""
    return Answer(Call("recommend", "POST", "/recommend"), due, sent, done, 200 if error is None else None, error)


def test_summarise_excludes_warm_up_and_breaks_errors_down():
    outcomes = [
        outcome(due=0.5, sent=0.5, done=0.6, error=None),  # warm-up: ignored
        outcome(due=1.0, sent=1.001, done=1.010, error=None),  # 10 ms
        outcome(due=1.1, sent=1.1, done=1.130, error=None),  # 30 ms
        outcome(due=1.2, sent=1.2, done=1.220, error=None),  # 20 ms
        outcome(due=1.3, sent=1.3, done=1.301, error="HTTP 503"),
        outcome(due=1.4, sent=1.4, done=3.4, error="timeout"),
        outcome(due=1.5, sent=1.5, done=3.5, error="timeout"),
    ]
    result = summarise(outcomes, window_start=1.0, rate=10, duration_s=1.0)
    assert (result.sent, result.ok, result.errors) == (6, 3, 3)
    assert result.error_kinds == {"timeout": 2, "HTTP 503": 1}
    assert result.p50_ms == pytest.approx(20)
    assert result.max_ms == pytest.approx(30)
    assert result.throughput == pytest.approx(3.0)  # 3 answers; the last at 1.22 s, inside the 1 s window
    assert not result.passes()


def test_due_times_uniform_and_poisson():
    assert due_times(4, 1.0, seed=0, arrivals="uniform").tolist() == [0.0, 0.25, 0.5, 0.75]
    poisson = due_times(200, 50.0, seed=1)
    assert np.all(np.diff(poisson) >= 0)
    assert poisson[0] == 0
    assert poisson[-1] < 50.0
    assert len(poisson) == pytest.approx(10_000, rel=0.05)
    assert np.array_equal(poisson, due_times(200, 50.0, seed=1))
    with pytest.raises(SeqrecError):
        due_times(0, 1.0, seed=0)


def test_payloads_from_catalogue():
    catalogue = np.array([f"item{i}" for i in range(300)])
    payloads = payloads_from_catalogue(catalogue, 20, min_len=50, max_len=200, seed=7)
    assert len(payloads) == 20
    known = set(catalogue.tolist())
    for payload in payloads:
        history = payload["history"]
        assert 50 <= len(history) <= 200
        assert len(set(history)) == len(history)
        assert set(history) <= known
        assert all(isinstance(item, str) for item in history)
        assert (payload["k"], payload["candidates"], payload["rerank"]) == (10, 200, True)
    assert payloads == payloads_from_catalogue(catalogue, 20, seed=7)
    assert payloads != payloads_from_catalogue(catalogue, 20, seed=8)
    with pytest.raises(SeqrecError, match="fewer than the shortest history"):
        payloads_from_catalogue(catalogue[:10], 5)


def test_payloads_from_dataset_uses_test_inputs_of_long_enough_users():
    rows = [[1, 2, 3], [1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 2]]  # test inputs: all but the last item
    item_ids = np.array(["", "a", "b", "c", "d", "e", "f"], dtype=object)
    dataset = PreparedDataset(Path("toy"), {}, Sequences.from_lists(rows), np.array(["u0", "u1", "u2"]), item_ids,
                              pa.table({}), None)
    payloads = payloads_from_dataset(dataset, 10, min_len=5, max_len=4, seed=0)
    assert {tuple(p["history"]) for p in payloads} <= {("b", "c", "d", "e"), ("d", "c", "b", "a")}
    with pytest.raises(SeqrecError, match="no user"):
        payloads_from_dataset(dataset, 1, min_len=7)


def test_geometric_rates():
    assert geometric_rates(50, 400, factor=2) == [50, 100, 200, 400]


def test_report_table():
    ok = LoadResult(rate=100, duration_s=10, sent=1000, ok=1000, errors=0, error_kinds={}, throughput=100.0,
                    p50_ms=3.2, p95_ms=8.0, p99_ms=12.5, max_ms=20.0, send_lag_p99_ms=0.4, client_cpu=0.1)
    bad = LoadResult(rate=800, duration_s=10, sent=8000, ok=7990, errors=10, error_kinds={"timeout": 10},
                     throughput=790.0, p50_ms=30, p95_ms=400, p99_ms=900, max_ms=2000, send_lag_p99_ms=1.0,
                     client_cpu=0.5)
    lines = report_table([ok, bad]).splitlines()
    assert lines[0].startswith("| rate r/s | sent | ok | errors |")
    assert lines[2] == "| 100 | 1000 | 1000 | 0 | 100.0 | 3.20 | 8.00 | 12.50 | 20.00 | 0.10 |"
    assert "10 (timeout: 10)" in lines[3]


class _Held:
    """An object the cyclic collector tracks (it has a __dict__)."""


def test_the_client_freezes_what_was_alive_for_the_run_and_unfreezes_after_even_on_error() -> None:
    before = _Held()

    def walked(obj: object) -> bool:
        return any(o is obj for o in gc.get_objects())

    seen: list[bool] = []

    def failing_run() -> None:
        with quiet_collector():
            seen.append(walked(before))  # frozen: a full collection in the run does not walk it
            seen.append(walked(_Held()))  # what the run allocates is still collected
            raise RuntimeError("the run failed")

    assert walked(before)
    with pytest.raises(RuntimeError):
        failing_run()
    assert seen == [False, True]
    assert walked(before)
    assert gc.get_freeze_count() == 0
