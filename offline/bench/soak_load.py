"""Soak: a long open-loop run at a fixed rate; latency, errors and the server's memory window by window.

`offline/bench/soak.py` runs it for minutes at half the service's maximum sustained rate; a one-minute
version is a slow test (`tests/service/test_faults.py`). Timings on a shared machine are only as
steady as the machine: ``wait_until_idle`` waits for trainings to end first.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offline.bench.faults import history_calls
from offline.bench.open_loop import Marks, open_loop, summary
from retriever.errors import SeqrecError

if TYPE_CHECKING:
    import aiohttp


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux: VmRSS in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError as err:
        raise SeqrecError(f"cannot read the memory of process {pid}: {err}") from err
    raise SeqrecError(f"/proc/{pid}/status has no VmRSS line")


def soak(url: str, pid: int, catalogue: Sequence[str], *, rate: float, minutes: float, window_s: float = 60.0,
         warmup_s: float = 10.0, sample_s: float = 5.0, seed: int = 0, p99_tolerance: float = 0.2,
         rss_tolerance: float = 0.1, timeout_s: float = 2.0) -> dict[str, Any]:
    """History-carrying requests at ``rate`` for ``warmup_s`` + ``minutes``; per window of ``window_s``
    (counted by due time, after the warm-up): p50, p99, errors and the server's RSS at the window's end
    (``pid``: the uvicorn process, sampled every ``sample_s``). Targets: every window's p99 within
    ``p99_tolerance`` of the first's, RSS at most ``rss_tolerance`` above the first window's end, 0 errors
    (warm-up included)."""
    n_windows = int(minutes * 60 // window_s)
    if n_windows < 2:
        raise SeqrecError(f"{minutes:g} min in windows of {window_s:g} s: need at least two windows to compare")
    calls = history_calls(catalogue, seed)
    samples: list[tuple[float, int]] = []

    async def sample(session: aiohttp.ClientSession, marks: Marks) -> None:
        while True:
            samples.append((time.perf_counter(), rss_bytes(pid)))
            await asyncio.sleep(sample_s)

    run = open_loop(url, lambda i: calls[i % len(calls)], rate, duration_s=warmup_s + n_windows * window_s,
                    action=sample, seed=seed, timeout_s=timeout_s)
    samples.append((time.perf_counter(), rss_bytes(pid)))
    windows = []
    for w in range(n_windows):
        lo = run.start + warmup_s + w * window_s
        hi = lo + window_s
        rss_end = max((t, rss) for t, rss in samples if t <= hi)[1]
        stats = summary([a for a in run.answers if lo <= a.due < hi])
        windows.append({"window": w + 1, **stats, "rss_mb": round(rss_end / 2**20, 1),
                        "rss_max_mb": round(max(rss for t, rss in samples if lo - sample_s <= t <= hi) / 2**20, 1)})
    p99s = [w["p99_ms"] for w in windows]
    first_p99 = p99s[0]
    worst = max((p for p in p99s if p is not None), default=None)
    p99_ratio = round(worst / first_p99, 3) if worst is not None and first_p99 else None
    rss_first = windows[0]["rss_mb"]
    rss_growth = round(max(w["rss_mb"] for w in windows[1:]) / rss_first - 1, 4)
    total = summary(run.answers)
    checks = {
        "p99_within_tolerance_of_first_window": p99_ratio is not None and p99_ratio <= 1 + p99_tolerance
        and None not in p99s,
        "rss_growth_within_tolerance": rss_growth < rss_tolerance,
        "no_errors": total["errors"] == 0,
    }
    return {"scenario": "soak", "rate": rate, "minutes": minutes, "window_s": window_s, "warmup_s": warmup_s,
            "load": total, "windows": windows, "p99_first_ms": first_p99, "p99_worst_ms": worst,
            "p99_ratio": p99_ratio, "rss_start_mb": round(samples[0][1] / 2**20, 1), "rss_first_window_mb": rss_first,
            "rss_last_mb": windows[-1]["rss_mb"], "rss_growth": rss_growth, "checks": checks,
            "passed": all(checks.values())}


BUSY = (r"(seqrec|offline\.cli) (pipeline|train|train-ranker|mine|bench|demo)", r"pytest")


def busy_processes(patterns: Sequence[str] = BUSY) -> list[str]:
    """Command lines of running processes that match ``patterns`` (regular expressions: trainings, benchmarks
    and test runs that would skew timings), this process excluded."""
    found = []
    for pattern in patterns:
        result = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
        found += [line for line in result.stdout.splitlines()
                  if line.strip() and line.split(maxsplit=1)[0] != str(os.getpid())]
    return found


def wait_until_idle(max_minutes: float, poll_s: float = 30.0) -> tuple[float, list[str]]:
    """Wait (polling) until no training runs, at most ``max_minutes``; returns the wait and what still runs."""
    start = time.monotonic()
    while (busy := busy_processes()) and time.monotonic() - start < max_minutes * 60:
        time.sleep(poll_s)
    return time.monotonic() - start, busy
