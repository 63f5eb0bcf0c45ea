"""`seqrec bench serve`: open-loop HTTP load against a real service process, and its framework ceiling.

The server runs as its own uvicorn process (``start_server``); the load client runs in this one.
Open loop: request i is due at a time fixed before the run starts (Poisson or evenly spaced
arrivals at ``rate`` per second), it is sent then whether or not earlier requests have come back,
and its latency is counted from that due time. A server (or client) that falls behind therefore
shows up in the latencies instead of quietly lowering the rate it is offered (no coordinated
omission). Errors (non-2xx, timeouts, refused connections) are counted, never raised.

``noop_app`` is a FastAPI app that parses the same request body and answers a constant: the same
client against it gives the ceiling this framework, server and machine reach with no model work.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from retriever.errors import SeqrecError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from offline.data.prepared import PreparedDataset

log = logging.getLogger(__name__)

NOOP_APP = "offline.bench.serve:noop_app"
P99_TARGET_MS = 50.0
Arrivals = Literal["poisson", "uniform"]


class ServerError(SeqrecError):
    """The server process could not be started or did not become ready."""


# --------------------------------------------------------------------------- the no-op server


class NoopRequest(BaseModel):
    """The service's request body, parsed and validated the same way, then ignored."""

    user_id: str | None = None
    history: list[str | int] | None = None
    k: int = Field(10, ge=1, le=1000)
    candidates: int = Field(200, ge=1)
    exclude_seen: bool = True
    rerank: bool = True


def noop_app() -> FastAPI:
    """POST /recommend parses the service's request body and answers a constant; GET /readyz."""
    from fastapi import FastAPI

    app = FastAPI(title="seqrec no-op ceiling")

    @app.post("/recommend")
    async def recommend(request: NoopRequest) -> dict[str, Any]:
        return {"items": [], "model_version": "noop", "k": request.k}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app


# --------------------------------------------------------------------------- running a server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, n_chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n_chars:].strip() or "(no output)"


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP(S)_PROXY


def _is_ready(url: str) -> bool:
    try:
        with _DIRECT.open(f"{url}/readyz", timeout=1.0) as response:
            return bool(200 <= response.status < 300)
    except (OSError, http.client.HTTPException):  # not listening yet, or not ready (non-2xx raises HTTPError)
        return False


@dataclass(frozen=True)
class RunningServer:
    """A started server process: its base URL, its pid (for RSS and the like) and its output file."""

    url: str
    pid: int
    log: Path  # stdout + stderr of the process; removed when the server stops


@contextlib.contextmanager
def start_server(app_spec: str, env: dict[str, str] | None = None, port: int | None = None, *,
                 ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``uvicorn APP_SPEC --factory`` on 127.0.0.1 in a subprocess; yield its base URL once
    GET /readyz answers 2xx; stop it (SIGTERM, then SIGKILL after 10 s) on exit.

    ``env`` is added to this process's environment (e.g. SEQREC_ARTIFACTS, SEQREC_THREADS=1).
    ``start_server_process`` does the same and yields the process's pid and output file too.
    """
    with start_server_process(app_spec, env, port, ready_timeout_s=ready_timeout_s) as server:
        yield server.url


@contextlib.contextmanager
def start_server_process(app_spec: str, env: dict[str, str] | None = None, port: int | None = None, *,
                         ready_timeout_s: float = 60.0) -> Iterator[RunningServer]:
    """``start_server``, yielding a ``RunningServer`` (a single uvicorn process: its pid serves the requests)."""
    port = free_port() if port is None else port
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", app_spec, "--factory", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1", "--log-level", "warning"]
    with tempfile.TemporaryDirectory(prefix="seqrec-serve-") as tmp:
        output = Path(tmp) / "server.log"
        with output.open("wb") as sink:  # a file, not a pipe: a chatty server can never block on a full pipe
            process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=sink,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + ready_timeout_s
            while not _is_ready(url):
                if process.poll() is not None:
                    raise ServerError(f"{app_spec} exited with code {process.returncode} before it was ready; "
                                      f"its output ends:\n{_tail(output)}")
                if time.monotonic() > deadline:
                    raise ServerError(f"{app_spec} was not ready at {url}/readyz after {ready_timeout_s:g} s; "
                                      f"its output ends:\n{_tail(output)}")
                time.sleep(0.1)
            log.info("%s ready at %s (pid %d)", app_spec, url, process.pid)
            yield RunningServer(url, process.pid, output)
        finally:
            stop_process(process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; returns once the process is gone."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --------------------------------------------------------------------------- payloads


def _payload(history: Sequence[str], k: int, candidates: int, rerank: bool) -> dict[str, Any]:
    return {"history": list(history), "k": k, "candidates": candidates, "rerank": rerank}


def load_catalogue(bundle: str | Path) -> np.ndarray:
    """BUNDLE/item_ids.npy: the external item ids the service knows."""
    path = Path(bundle) / "item_ids.npy"
    if not path.is_file():
        raise SeqrecError(f"{path}: not found; expected an artifact bundle with item_ids.npy")
    try:
        item_ids = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise SeqrecError(f"{path}: cannot read: {err}") from err
    return np.asarray(item_ids).astype(str)


def payloads_from_catalogue(item_ids: np.ndarray, n: int, min_len: int = 50, max_len: int = 200, seed: int = 0, *,
                            k: int = 10, candidates: int = 200, rerank: bool = True) -> list[dict[str, Any]]:
    """``n`` request bodies, each a history of min_len..max_len distinct catalogue ids in random order."""
    catalogue = np.asarray([str(item) for item in item_ids if str(item)])  # "" would be the padding placeholder
    if not 1 <= min_len <= max_len:
        raise SeqrecError(f"history lengths {min_len}..{max_len}: need 1 <= min_len <= max_len")
    if len(catalogue) < min_len:
        raise SeqrecError(f"the catalogue has {len(catalogue)} items, fewer than the shortest history ({min_len})")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, min(max_len, len(catalogue)) + 1, size=n)
    return [_payload(catalogue[rng.choice(len(catalogue), size=length, replace=False)].tolist(), k, candidates, rerank)
            for length in lengths]


def payloads_from_dataset(dataset: PreparedDataset, n: int, min_len: int = 50, max_len: int = 200, seed: int = 0, *,
                          k: int = 10, candidates: int = 200, rerank: bool = True) -> list[dict[str, Any]]:
    """``n`` request bodies from real users' test inputs (everything but their last item), cut to the
    most recent ``max_len`` items; users with fewer than ``min_len`` are skipped, the rest sampled."""
    inputs = dataset.split().inputs("test")
    eligible = np.flatnonzero(inputs.lengths >= min_len)
    if not len(eligible):
        raise SeqrecError(f"{dataset.path}: no user has a test input of {min_len} items or more")
    rng = np.random.default_rng(seed)
    users = rng.choice(eligible, size=n, replace=n > len(eligible))
    return [_payload(dataset.item_ids[inputs.row(int(user))[-max_len:]].astype(str).tolist(), k, candidates, rerank)
            for user in users]


# --------------------------------------------------------------------------- the load client


@dataclass(frozen=True)
class LoadResult:
    """One open-loop run. Counts and latencies cover the requests due after the warm-up only;
    latencies (from each request's due time to its full response) are those of 2xx answers."""

    rate: float  # offered, requests/s
    duration_s: float
    sent: int
    ok: int
    errors: int
    error_kinds: dict[str, int]  # "HTTP 500", "timeout", "connect", "disconnected", ...
    throughput: float  # 2xx answers per second, from the window's start to its last answer
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    send_lag_p99_ms: float  # how late the client sent (its own overload shows here first)
    client_cpu: float  # this process's CPU seconds per wall second (1.0 = one core)
    label: str = ""

    def passes(self, p99_ms: float = P99_TARGET_MS) -> bool:
        return self.errors == 0 and self.ok > 0 and self.p99_ms <= p99_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN (no 2xx answer to measure) becomes None."""
        return {key: None if isinstance(value, float) and math.isnan(value) else value
                for key, value in asdict(self).items()}


def due_times(rate: float, total_s: float, seed: int, arrivals: Arrivals = "poisson") -> np.ndarray:
    """Send times in seconds from the start: a Poisson process or even spacing at ``rate`` per second."""
    if rate <= 0 or total_s <= 0:
        raise SeqrecError(f"rate {rate:g}/s over {total_s:g} s: both must be positive")
    expected = rate * total_s
    if arrivals == "uniform":
        return np.arange(math.ceil(expected - 1e-9)) / rate
    if arrivals != "poisson":
        raise SeqrecError(f"unknown arrivals {arrivals!r}; expected 'poisson' or 'uniform'")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(expected + 10 * math.sqrt(expected) + 10))
    times = np.cumsum(gaps) - gaps[0]  # first request at t = 0
    return times[times < total_s]


class Outcome(NamedTuple):
    """One request: when it was due, sent and answered (perf_counter seconds); its error, if any."""

    due: float
    sent: float
    done: float
    error: str | None


def _error_kind(err: BaseException) -> str:
    import aiohttp

    if isinstance(err, TimeoutError):  # aiohttp's own timeouts subclass it
        return "timeout"
    if isinstance(err, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return "connect"
    if isinstance(err, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return "disconnected"
    return type(err).__name__


async def _load(url: str, bodies: Sequence[bytes], times: np.ndarray, timeout_s: float,
                max_connections: int) -> tuple[list[Outcome], float]:
    """POST bodies[i % len] to url/recommend at start + times[i] -> every outcome, start.

    aiohttp rather than httpx: on this machine it sent the same load for a third to a quarter of
    the client CPU (which the server shares), and httpx fell into timeouts at 600 requests/s
    against the no-op server, which aiohttp served at 1,500 with p99 under 10 ms.
    """
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max_connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)  # one deadline for pool wait, connect, send and read
    headers = {"content-type": "application/json"}
    outcomes: list[Outcome] = []
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout, headers=headers) as session:

        async def post(body: bytes) -> str | None:
            async with session.post("/recommend", data=body) as response:
                await response.read()
                return None if 200 <= response.status < 300 else f"HTTP {response.status}"

        async def one(body: bytes, due: float) -> None:
            sent = time.perf_counter()
            try:
                error = await post(body)
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                error = _error_kind(err)
            outcomes.append(Outcome(due, sent, time.perf_counter(), error))

        # a few keep-alive connections opened before the clock starts; their errors show up in the run
        await asyncio.gather(*(post(bodies[0]) for _ in range(8)), return_exceptions=True)
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter() + 0.05
        for i, offset in enumerate(times):
            due = start + float(offset)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(bodies[i % len(bodies)], due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)
    return outcomes, start


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # the standard loop works too, at a higher client CPU cost per request
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def run_load(url: str, payloads: Sequence[dict[str, Any]], rate: float, duration_s: float, warmup_s: float = 1.0,
             seed: int = 0, *, arrivals: Arrivals = "poisson", timeout_s: float = 2.0, max_connections: int = 512,
             label: str = "") -> LoadResult:
    """Offer POST {url}/recommend at ``rate`` requests/s for warmup_s + duration_s (payloads in turn)."""
    if not payloads:
        raise SeqrecError("no payloads to send")
    if warmup_s < 0:
        raise SeqrecError(f"warm-up {warmup_s:g} s: must be >= 0")
    bodies = [json.dumps(payload).encode() for payload in payloads]  # serialised once: the client stays light
    times = due_times(rate, warmup_s + duration_s, seed, arrivals)
    cpu, wall = time.process_time(), time.perf_counter()
    outcomes, start = _run(_load(url.rstrip("/"), bodies, times, timeout_s, max_connections))
    client_cpu = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    return summarise(outcomes, start + warmup_s, rate, duration_s, client_cpu, label)


def summarise(outcomes: Sequence[Outcome], window_start: float, rate: float, duration_s: float,
              client_cpu: float = 0.0, label: str = "") -> LoadResult:
    """Counts and latency percentiles of the requests due at or after ``window_start``."""
    measured = [outcome for outcome in outcomes if outcome.due >= window_start]
    kinds = Counter(outcome.error for outcome in measured if outcome.error is not None)
    answered = [outcome for outcome in measured if outcome.error is None]
    latencies = np.asarray([outcome.done - outcome.due for outcome in answered]) * 1000
    lags = np.asarray([outcome.sent - outcome.due for outcome in measured]) * 1000
    last = max((outcome.done for outcome in answered), default=window_start)
    elapsed = max(last - window_start, duration_s)  # a server that falls behind answers after the window

    def pct(values: np.ndarray, q: float) -> float:
        return round(float(np.percentile(values, q)), 3) if len(values) else math.nan

    return LoadResult(rate=rate, duration_s=duration_s, sent=len(measured), ok=len(answered),
                      errors=sum(kinds.values()), error_kinds=dict(kinds.most_common()),
                      throughput=round(len(answered) / elapsed, 2), p50_ms=pct(latencies, 50),
                      p95_ms=pct(latencies, 95), p99_ms=pct(latencies, 99), max_ms=pct(latencies, 100),
                      send_lag_p99_ms=pct(lags, 99), client_cpu=round(client_cpu, 3), label=label)


# --------------------------------------------------------------------------- sweeps and tables


def sweep(url: str, payloads: Sequence[dict[str, Any]], rates: Sequence[float], duration_s: float,
          warmup_s: float = 1.0, seed: int = 0, *, stop_on_failure: bool = False,
          p99_ms: float = P99_TARGET_MS, **options: Any) -> list[LoadResult]:
    """run_load at each rate in turn (ascending); with stop_on_failure, up to the first that fails
    the p99 / zero-error target. ``options`` go to run_load (arrivals, timeout_s, label, ...)."""
    results: list[LoadResult] = []
    for rate in sorted(rates):
        result = run_load(url, payloads, rate, duration_s, warmup_s, seed, **options)
        log.info("%s %7.1f r/s: ok %d/%d, p50 %.2f ms, p99 %.2f ms, errors %s, client cpu %.2f",
                 result.label or url, rate, result.ok, result.sent, result.p50_ms, result.p99_ms,
                 result.error_kinds or 0, result.client_cpu)
        results.append(result)
        if stop_on_failure and not result.passes(p99_ms):
            break
    return results


def geometric_rates(start: float, stop: float, factor: float = 1.5) -> list[float]:
    """start, start*factor, ... up to stop (rounded to whole requests/s)."""
    if start <= 0 or stop < start or factor <= 1:
        raise SeqrecError(f"rates {start:g}..{stop:g} x{factor:g}: need 0 < start <= stop and factor > 1")
    rates: list[float] = []
    rate = start
    while rate <= stop * (1 + 1e-9):
        rates.append(float(round(rate)))
        rate *= factor
    return sorted(set(rates))


@dataclass(frozen=True)
class Sustained:
    """The highest offered rate that met the target (None if none did), and every run on the way."""

    rate: float | None
    results: list[LoadResult]


def max_sustained_rate(url: str, payloads: Sequence[dict[str, Any]], rates: Sequence[float], duration_s: float,
                       warmup_s: float = 1.0, seed: int = 0, *, p99_ms: float = P99_TARGET_MS,
                       **options: Any) -> Sustained:
    """Step up through ``rates`` until one fails (p99 > p99_ms or any error); the last that passed wins."""
    results = sweep(url, payloads, rates, duration_s, warmup_s, seed, stop_on_failure=True, p99_ms=p99_ms,
                    **options)
    passed = [result.rate for result in results if result.passes(p99_ms)]
    return Sustained(max(passed) if passed else None, results)


def report_table(results: Sequence[LoadResult]) -> str:
    """Markdown: one row per run."""
    has_labels = any(result.label for result in results)
    head = ["rate r/s", "sent", "ok", "errors", "throughput r/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
            "client CPU"]
    head = ["target", *head] if has_labels else head
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for result in results:
        errors = str(result.errors)
        if result.error_kinds:
            errors += " (" + ", ".join(f"{kind}: {count}" for kind, count in result.error_kinds.items()) + ")"
        row = [f"{result.rate:g}", str(result.sent), str(result.ok), errors, f"{result.throughput:.1f}",
               f"{result.p50_ms:.2f}", f"{result.p95_ms:.2f}", f"{result.p99_ms:.2f}", f"{result.max_ms:.2f}",
               f"{result.client_cpu:.2f}"]
        lines.append("| " + " | ".join([result.label, *row] if has_labels else row) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- `seqrec bench serve`


def run_serve_bench(args: Any) -> int:
    """Sweep the same offered rates against the no-op app and against each bundle's service; write
    OUT/serve.{json,md}: the p99 at ``--check-rate`` and the highest rate held with p99 <= 50 ms."""
    rates = sorted({float(r) for r in args.rates.split(",") if r.strip()})
    if not rates or min(rates) <= 0:
        raise SeqrecError(f"--rates must be positive numbers, got {args.rates!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    options = {"arrivals": args.arrivals, "timeout_s": args.timeout}
    settings = {k: v for k, v in vars(args).items() if k != "handler"}
    report: dict[str, Any] = {"settings": json.loads(json.dumps(settings, default=str)), "targets": {}}
    runs: list[LoadResult] = []

    def measure(label: str, app: str, env: dict[str, str], payloads: list[dict[str, Any]]) -> dict[str, Any]:
        with start_server(app, env) as url:
            run_load(url, payloads, min(rates), 2.0, 0.5, args.seed, label=label, **options)  # warm the server up
            check = run_load(url, payloads, args.check_rate, args.duration, args.warmup, args.seed, label=label,
                             **options)
            sustained = max_sustained_rate(url, payloads, rates, args.duration, args.warmup, args.seed, label=label,
                                           **options)
        runs.extend([check, *sustained.results])
        return {"check": check.to_dict(), "max_rate_p99_50ms": sustained.rate,
                "sweep": [r.to_dict() for r in sustained.results]}

    env = {"SEQREC_THREADS": str(args.threads), "SEQREC_MAX_BATCH": str(args.max_batch),
           "SEQREC_MAX_WAIT_MS": str(args.max_wait_ms), "SEQREC_LOG_LEVEL": "warning"}
    for bundle in args.artifact:
        item_ids = load_catalogue(bundle)
        payloads = payloads_from_catalogue(item_ids, args.requests, args.min_len, args.max_len, args.seed,
                                           k=args.k, candidates=args.candidates, rerank=not args.no_rerank)
        if args.personalize:
            for payload in payloads:
                payload["personalize"] = True
        name = Path(bundle).name
        noop = measure(f"no-op ({name} bodies)", NOOP_APP, env, payloads)
        service = measure(name, "service.app:create_app", {**env, "SEQREC_ARTIFACTS": str(bundle)}, payloads)
        ratio = (service["max_rate_p99_50ms"] / noop["max_rate_p99_50ms"]
                 if service["max_rate_p99_50ms"] and noop["max_rate_p99_50ms"] else None)
        report["targets"][name] = {"bundle": str(bundle), "catalogue": len(item_ids), "noop": noop,
                                   "service": service, "ratio_to_noop": ratio}
    (args.out / "serve.json").write_text(json.dumps(report, indent=2))
    lines = ["# seqrec bench serve", "",
             f"Open-loop {args.arrivals} arrivals, {args.duration:g} s per rate after {args.warmup:g} s warm-up; "
             f"histories of {args.min_len}-{args.max_len} random catalogue items, k={args.k}, "
             f"candidates={args.candidates}, rerank={not args.no_rerank}, personalize={args.personalize}; "
             f"server: 1 uvicorn worker, {args.threads} torch thread(s), max batch {args.max_batch}, "
             f"max wait {args.max_wait_ms:g} ms.", "",
             "| bundle | items | p99 at check rate (ms) | errors | max rate, p99 <= 50 ms | no-op max rate | ratio |",
             "|---|---|---|---|---|---|---|"]
    for name, t in report["targets"].items():
        check = t["service"]["check"]
        ratio = "" if t["ratio_to_noop"] is None else f"{t['ratio_to_noop']:.3f}"
        lines.append(f"| {name} | {t['catalogue']} | {check['p99_ms']} at {args.check_rate:g} r/s | "
                     f"{check['errors']} | {t['service']['max_rate_p99_50ms']} | {t['noop']['max_rate_p99_50ms']} | "
                     f"{ratio} |")
    lines += ["", "## Every run", "", report_table(runs)]
    (args.out / "serve.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0
