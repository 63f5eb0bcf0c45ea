"""The open-loop HTTP load client of every bench and test: any mix of routes, an action alongside.

Open loop: request i is due at a time fixed before it is sent (Poisson or evenly spaced arrivals
at ``rate`` per second) and is sent then whether or not earlier ones have come back; its latency
counts from that due time. A server (or client) that falls behind therefore shows up in the
latencies instead of quietly lowering the rate it is offered (no coordinated omission). Every
answer is kept with its route kind, times and status; errors (non-2xx, timeouts, refused
connections) are recorded, never raised.

``run_load`` offers POST /recommend bodies for a fixed time and summarises the run as a
``LoadResult`` (`offline.bench.lib.sweeps` steps it through rates); ``open_loop`` sends any calls
while an action runs alongside (it kills Redis, publishes a model, samples memory) and returns
every ``Answer`` for the scenario to class (`offline.bench.faults.redis_faults`, `offline.bench.faults.bad_push`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from common.errors import SeqrecError
from offline.bench.lib.processes import DIRECT

if TYPE_CHECKING:
    import aiohttp

JSON_HEADERS = {"content-type": "application/json"}
P99_TARGET_MS = 50.0
WARM_CONNECTIONS = 8  # keep-alive connections opened before run_load's clock starts
Arrivals = Literal["poisson", "uniform"]
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One request to send: ``kind`` is what the report groups answers by."""

    kind: str
    method: str
    path: str
    body: bytes | None = None
    keep: bool = False  # keep a 2xx answer's body (error bodies are always kept)
    key: str | None = None  # the caller's own id for it (an event's user and item)


@dataclass(frozen=True)
class Answer:
    call: Call
    due: float  # perf_counter seconds
    sent: float
    done: float
    status: int | None  # None when no HTTP answer came (timeout, refused, reset)
    error: str | None  # None for 2xx; else "HTTP 503", "timeout", "connect", "disconnected", ...
    body: bytes | None = None

    @property
    def latency_ms(self) -> float:
        return 1000 * (self.done - self.due)


Marks = dict[str, float]  # name -> perf_counter time of something the action did
Action = Callable[["aiohttp.ClientSession", Marks], Awaitable[Any]]


@dataclass
class LoadRun:
    answers: list[Answer]
    start: float  # when the first request was due
    marks: Marks = field(default_factory=dict)
    result: Any = None  # what the action returned


# --------------------------------------------------------------------------- arrival schedules


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


def poisson_offsets(rate: float, seed: int) -> Iterator[float]:
    """An endless Poisson schedule (0, then one exponential gap after another), for loads that end by time."""
    rng = np.random.default_rng(seed)
    offset = 0.0
    while True:
        yield offset
        offset += float(rng.exponential(1.0 / rate))


def error_kind(err: BaseException) -> str:
    import aiohttp

    if isinstance(err, TimeoutError):  # aiohttp's own timeouts subclass it
        return "timeout"
    if isinstance(err, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return "connect"
    if isinstance(err, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return "disconnected"
    return type(err).__name__


def run_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """uvloop when installed: the client then needs a third to a quarter of the CPU (which the server shares).

    The client's heap is frozen meanwhile (`quiet_collector`): a bench that has loaded a bundle in-process
    (the reference answers) would otherwise stop its own client for a full collection now and then, and the
    requests due meanwhile would count that stall as the server's latency."""
    with quiet_collector():
        try:
            import uvloop
        except ImportError:  # the standard loop works too, at a higher client CPU cost per request
            return asyncio.run(coroutine)
        return uvloop.run(coroutine)


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Collect, then freeze what is alive (`gc.freeze`) for the block; unfreeze after it. Python's full collections
    walk every tracked object while holding the GIL; with a loaded bundle in the process each one stopped the
    client for about 200 ms (the no-op app's p99 at 800 r/s 160 ms, its send lag 132 ms:
    docs/results/serve/gc-freeze/). Frozen objects are not walked; what the block allocates still is."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class _Plan:
    """What one open-loop run sends: ``make_call(i)`` at start + the i-th offset of ``schedule``."""

    make_call: Callable[[int], Call]
    schedule: Iterable[float]
    duration_s: float | None = None  # stop sending after this; None: when the schedule or the action ends
    action: Action | None = None
    tail_s: float = 0.0  # seconds of load after the action returned (without a duration)
    warm_up: Call | None = None  # sent WARM_CONNECTIONS times before the clock starts


async def _drive(url: str, plan: _Plan, timeout_s: float, max_connections: int,
                 headers: Mapping[str, str]) -> LoadRun:
    """aiohttp rather than httpx: on this machine it sent the same load for a third to a quarter of the
    client CPU, and httpx fell into timeouts at 600 requests/s against the no-op server, which aiohttp
    served at 1,500 with p99 under 10 ms."""
    import aiohttp

    answers: list[Answer] = []
    marks: Marks = {}
    connector = aiohttp.TCPConnector(limit=max_connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)  # one deadline for pool wait, connect, send and read
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout, headers=dict(headers)) as session:

        async def one(call: Call, due: float) -> None:
            sent = time.perf_counter()
            status: int | None = None
            body: bytes | None = None
            try:
                async with session.request(call.method, call.path, data=call.body,
                                           headers=JSON_HEADERS if call.body is not None else None) as response:
                    payload = await response.read()
                status = response.status
                error = None if 200 <= status < 300 else f"HTTP {status}"
                body = payload if call.keep or error else None
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                error = error_kind(err)
            answers.append(Answer(call, due, sent, time.perf_counter(), status, error, body))

        async def warm(call: Call) -> None:
            async with session.request(call.method, call.path, data=call.body, headers=JSON_HEADERS) as response:
                await response.read()

        if plan.warm_up is not None:  # a few keep-alive connections; their errors show up in the run itself
            await asyncio.gather(*(warm(plan.warm_up) for _ in range(WARM_CONNECTIONS)), return_exceptions=True)
        start = time.perf_counter() + 0.05
        marks["start"] = start
        result = await _send_all(session, plan, start, marks, one)
    answers.sort(key=lambda a: a.due)
    return LoadRun(answers, start, marks, result)


async def _send_all(session: aiohttp.ClientSession, plan: _Plan, start: float, marks: Marks,
                    one: Callable[[Call, float], Coroutine[Any, Any, None]]) -> Any:
    """Send each call when due until the schedule, the duration or the action (and its tail) ends; wait for
    every answer; then the action's result (its error raised; cancelled if still running)."""

    async def act() -> Any:
        assert plan.action is not None
        try:
            return await plan.action(session, marks)
        finally:
            marks.setdefault("action_done", time.perf_counter())

    acting = asyncio.create_task(act()) if plan.action is not None else None
    waits_for_action = acting is not None and plan.duration_s is None
    stop_at = start + plan.duration_s if plan.duration_s is not None else math.inf
    tasks: set[asyncio.Task[None]] = set()
    offsets = iter(plan.schedule)
    for i in itertools.count():
        offset = next(offsets, None)
        if offset is None:
            break
        due = start + offset
        while due < stop_at:
            if acting is not None and acting.done():
                if acting.cancelled() or acting.exception() is not None:
                    stop_at = -math.inf  # a failed action stops the load; its error is raised below
                    break
                if waits_for_action:
                    stop_at = min(stop_at, marks["action_done"] + plan.tail_s)
                    if due >= stop_at:
                        break
            delay = due - time.perf_counter()
            if delay <= 0:
                break
            await asyncio.sleep(min(delay, 0.05) if waits_for_action else delay)  # re-check the action
        if due >= stop_at:
            break
        task = asyncio.create_task(one(plan.make_call(i), due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)
    if acting is None:
        return None
    if not acting.done():
        acting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acting
        return None
    return acting.result()  # raises the action's own error


def open_loop(url: str, make_call: Callable[[int], Call], rate: float, *, duration_s: float | None = None,
              action: Action | None = None, tail_s: float = 0.0, seed: int = 0, timeout_s: float = 2.0,
              max_connections: int = 256, headers: Mapping[str, str] | None = None) -> LoadRun:
    """Send ``make_call(0), make_call(1), ...`` at Poisson arrivals of ``rate`` per second, each when due
    whether or not earlier ones have come back, for ``duration_s`` or, without one, until ``action`` has
    returned and ``tail_s`` seconds more. ``action`` runs alongside the load from its start (it kills
    Redis, publishes a model, samples memory) and records the times of what it did in its ``Marks``;
    an action still running when a fixed duration ends is cancelled, one that fails stops the load and
    its error is raised."""
    if rate <= 0:
        raise SeqrecError(f"rate {rate:g}/s: must be positive")
    if duration_s is None and action is None:
        raise SeqrecError("open_loop needs a duration or an action to end the load")
    plan = _Plan(make_call, poisson_offsets(rate, seed), duration_s, action, tail_s)
    return run_loop(_drive(url.rstrip("/"), plan, timeout_s, max_connections, headers or {}))


# --------------------------------------------------------------------------- POST /recommend at a rate


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


def run_load(url: str, payloads: Sequence[dict[str, Any]], rate: float, duration_s: float, warmup_s: float = 1.0,
             seed: int = 0, *, arrivals: Arrivals = "poisson", timeout_s: float = 2.0, max_connections: int = 512,
             label: str = "") -> LoadResult:
    """Offer POST {url}/recommend at ``rate`` requests/s for warmup_s + duration_s (payloads in turn)."""
    if not payloads:
        raise SeqrecError("no payloads to send")
    if warmup_s < 0:
        raise SeqrecError(f"warm-up {warmup_s:g} s: must be >= 0")
    # serialised once: the client stays light
    calls = [Call("recommend", "POST", "/recommend", json.dumps(payload).encode()) for payload in payloads]
    times = due_times(rate, warmup_s + duration_s, seed, arrivals)
    plan = _Plan(lambda i: calls[i % len(calls)], times.tolist(), warm_up=calls[0])
    cpu, wall = time.process_time(), time.perf_counter()
    run = run_loop(_drive(url.rstrip("/"), plan, timeout_s, max_connections, {}))
    client_cpu = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    return summarise(run.answers, run.start + warmup_s, rate, duration_s, client_cpu, label)


def _percentile(values: Sequence[float] | np.ndarray, q: float, digits: int) -> float | None:
    return round(float(np.percentile(values, q)), digits) if len(values) else None


def summarise(answers: Sequence[Answer], window_start: float, rate: float, duration_s: float,
              client_cpu: float = 0.0, label: str = "") -> LoadResult:
    """Counts and latency percentiles of the requests due at or after ``window_start``."""
    measured = [a for a in answers if a.due >= window_start]
    kinds = Counter(a.error for a in measured if a.error is not None)
    answered = [a for a in measured if a.error is None]
    latencies = np.asarray([a.done - a.due for a in answered]) * 1000
    lags = np.asarray([a.sent - a.due for a in measured]) * 1000
    last = max((a.done for a in answered), default=window_start)
    elapsed = max(last - window_start, duration_s)  # a server that falls behind answers after the window

    def pct(values: np.ndarray, q: float) -> float:
        found = _percentile(values, q, 3)
        return math.nan if found is None else found

    return LoadResult(rate=rate, duration_s=duration_s, sent=len(measured), ok=len(answered),
                      errors=sum(kinds.values()), error_kinds=dict(kinds.most_common()),
                      throughput=round(len(answered) / elapsed, 2), p50_ms=pct(latencies, 50),
                      p95_ms=pct(latencies, 95), p99_ms=pct(latencies, 99), max_ms=pct(latencies, 100),
                      send_lag_p99_ms=pct(lags, 99), client_cpu=round(client_cpu, 3), label=label)


def summary(answers: Sequence[Answer]) -> dict[str, Any]:
    """Counts, errors by kind and latency percentiles (of the 2xx answers, from their due times)."""
    kinds = Counter(a.error for a in answers if a.error is not None)
    latencies = [a.latency_ms for a in answers if a.error is None]
    return {"sent": len(answers), "ok": len(latencies), "errors": sum(kinds.values()),
            "error_kinds": dict(kinds.most_common()), "p50_ms": _percentile(latencies, 50, 2),
            "p99_ms": _percentile(latencies, 99, 2), "max_ms": _percentile(latencies, 100, 2)}


# --------------------------------------------------------------------------- single requests


def get_json(url: str, path: str) -> dict[str, Any]:
    """GET url + path (outside the load): its JSON body; a non-2xx answer raises urllib's HTTPError."""
    with DIRECT.open(url.rstrip("/") + path, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def post_json(url: str, path: str, body: Any, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    """POST a JSON body to url + path (outside the load): (status, JSON answer), whatever the status."""
    request = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                     headers={**JSON_HEADERS, **(headers or {})})
    try:
        with DIRECT.open(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
