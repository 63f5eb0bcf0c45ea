"""An open-loop HTTP client for any mix of routes, with an action running alongside the load.

Request i is due at a time fixed before it is sent (Poisson arrivals at ``rate`` per second) and is
sent then whether or not earlier ones have come back; its latency counts from that due time (no
coordinated omission, as in `offline.bench.serve`, whose client only POSTs /recommend). Every answer
is kept with its route kind, times and status, so a scenario can class answers by what its action
was doing when they were sent (`offline.bench.faults`). Errors are recorded, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever.errors import SeqrecError

if TYPE_CHECKING:
    import aiohttp

JSON_HEADERS = {"content-type": "application/json"}
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP(S)_PROXY


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
    return asyncio.run(_open_loop(url.rstrip("/"), make_call, rate, duration_s, action, tail_s, seed, timeout_s,
                                  max_connections, dict(headers or {})))


async def _open_loop(url: str, make_call: Callable[[int], Call], rate: float, duration_s: float | None,
                     action: Action | None, tail_s: float, seed: int, timeout_s: float, max_connections: int,
                     headers: dict[str, str]) -> LoadRun:
    import aiohttp

    from offline.bench.serve import _error_kind

    rng = np.random.default_rng(seed)
    answers: list[Answer] = []
    marks: Marks = {}
    connector = aiohttp.TCPConnector(limit=max_connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout, headers=headers) as session:

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
                error = _error_kind(err)
            answers.append(Answer(call, due, sent, time.perf_counter(), status, error, body))

        async def act() -> Any:
            assert action is not None
            try:
                return await action(session, marks)
            finally:
                marks.setdefault("action_done", time.perf_counter())

        start = time.perf_counter() + 0.05
        marks["start"] = start
        acting = asyncio.create_task(act()) if action is not None else None
        stop_at = start + duration_s if duration_s is not None else math.inf
        tasks: set[asyncio.Task[None]] = set()
        due, i = start, 0
        while due < stop_at:
            if acting is not None and acting.done():
                if acting.cancelled() or acting.exception() is not None:
                    break
                if duration_s is None:
                    stop_at = min(stop_at, marks["action_done"] + tail_s)
                    if due >= stop_at:
                        break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(min(delay, 0.05) if acting is not None and duration_s is None else delay)
                continue  # re-check the action before sending what is due
            task = asyncio.create_task(one(make_call(i), due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            due += float(rng.exponential(1.0 / rate))
        if tasks:
            await asyncio.wait(tasks)
        result = None
        if acting is not None:
            if not acting.done():
                acting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acting
            else:
                result = acting.result()  # raises the action's own error
    answers.sort(key=lambda a: a.due)
    return LoadRun(answers, start, marks, result)


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def summary(answers: Sequence[Answer]) -> dict[str, Any]:
    """Counts, errors by kind and latency percentiles (of the 2xx answers, from their due times)."""
    kinds = Counter(a.error for a in answers if a.error is not None)
    latencies = [a.latency_ms for a in answers if a.error is None]
    return {"sent": len(answers), "ok": len(latencies), "errors": sum(kinds.values()),
            "error_kinds": dict(kinds.most_common()), "p50_ms": _pct(latencies, 50), "p99_ms": _pct(latencies, 99),
            "max_ms": _pct(latencies, 100)}


def get_json(url: str, path: str) -> dict[str, Any]:
    """GET url + path (outside the load): its JSON body; a non-2xx answer raises urllib's HTTPError."""
    with _DIRECT.open(url.rstrip("/") + path, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def post_json(url: str, path: str, body: Any, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    """POST a JSON body to url + path (outside the load): (status, JSON answer), whatever the status."""
    request = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                     headers={**JSON_HEADERS, **(headers or {})})
    try:
        with _DIRECT.open(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
