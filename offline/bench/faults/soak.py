"""Soak: minutes of steady load at half the maximum sustained rate; latency and memory must hold.

    python -m offline.bench.faults.soak --artifacts /tmp/rel-artifacts --minutes 10 --wait-idle 40 [--out FILE]

Serves ARTIFACTS/current (trained first with `seqrec pipeline --config CONFIG` when there is none).
Without --rate, first finds the highest rate the service sustains with p99 <= --p99-ms and no error
(`offline.bench.lib.sweeps.max_sustained_rate`, --probe seconds per step up --probe-rates) and soaks at
half of it. Then offers history-carrying requests at that rate (open loop, Poisson) for --warmup
seconds plus --minutes, and reports per window of --window seconds: p50, p99, errors and the uvicorn
process's RSS (from /proc). Prints a JSON report (`offline.bench.faults.soak.soak`) and exits 1 when a target is missed:
every window's p99 within 20 % of the first window's, RSS at most 10 % above the first window's end,
0 errors, no traceback in the server's log. A one-minute version is a slow test
(`tests/service/test_faults.py`).

Other processes skew the timings on a shared machine: --wait-idle MINUTES first waits (polling
every 30 s) until no training, benchmark or test run is left (`offline.bench.faults.soak.BUSY`), and the report
lists what still ran.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from common.errors import SeqrecError
from offline.bench.faults.reliability import (
    check_log,
    current_bundle,
    history_calls,
    print_report,
    scenario_parser,
    service_env,
)
from offline.bench.lib.load import P99_TARGET_MS, LoadRun, Marks, open_loop, run_load, summary
from offline.bench.lib.payloads import load_catalogue, short_payloads
from offline.bench.lib.processes import SERVICE_APP, rss_bytes, start_server_process
from offline.bench.lib.sweeps import geometric_rates, max_sustained_rate

if TYPE_CHECKING:
    import aiohttp

BUSY = (r"(seqrec|offline\.cli) (pipeline|train|train-ranker|mine|bench|demo)", r"pytest")


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
    windows = _windows(run, samples, n_windows, window_s, warmup_s, sample_s)
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


def _windows(run: LoadRun, samples: Sequence[tuple[float, int]], n_windows: int, window_s: float, warmup_s: float,
             sample_s: float) -> list[dict[str, Any]]:
    """Per window (by due time, after the warm-up): the load's figures and the RSS at its end and its highest."""
    windows = []
    for w in range(n_windows):
        lo = run.start + warmup_s + w * window_s
        hi = lo + window_s
        rss_end = max((t, rss) for t, rss in samples if t <= hi)[1]
        stats = summary([a for a in run.answers if lo <= a.due < hi])
        windows.append({"window": w + 1, **stats, "rss_mb": round(rss_end / 2**20, 1),
                        "rss_max_mb": round(max(rss for t, rss in samples if lo - sample_s <= t <= hi) / 2**20, 1)})
    return windows


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


# --------------------------------------------------------------------------- the script


def _parser() -> argparse.ArgumentParser:
    parser = scenario_parser(__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=None, help="requests per second (default: half the max)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of load before the first window")
    parser.add_argument("--probe", type=float, default=10.0, help="seconds per rate while finding the max")
    parser.add_argument("--probe-rates", default="10,400", help="first,last rate of the search (x1.5 steps)")
    parser.add_argument("--p99-ms", type=float, default=P99_TARGET_MS, help="the max rate's p99 target")
    parser.add_argument("--wait-idle", type=float, default=0.0, help="minutes to wait for trainings to end")
    return parser


def _probe(url: str, payloads: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any] | None:
    """The highest rate held with p99 <= --p99-ms and no error, and its steps; None when no rate held."""
    first, last = (float(x) for x in args.probe_rates.split(","))
    sustained = max_sustained_rate(url, payloads, geometric_rates(first, last), args.probe, 2.0, args.seed,
                                   p99_ms=args.p99_ms)
    if sustained.rate is None:
        print(f"no rate from {first:g}/s up met p99 <= {args.p99_ms:g} ms without errors", file=sys.stderr)
        return None
    return {"max_sustained_rate": sustained.rate, "p99_target_ms": args.p99_ms,
            "steps": [{k: r.to_dict()[k] for k in ("rate", "sent", "errors", "p50_ms", "p99_ms")}
                      for r in sustained.results]}


def main() -> int:
    args = _parser().parse_args()
    bundle = current_bundle(args)
    waited_s, busy = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else (0.0, busy_processes())
    load_before = os.getloadavg()
    catalogue = load_catalogue(bundle)
    payloads = short_payloads(catalogue, 300, args.seed)
    probe = None
    with start_server_process(SERVICE_APP, service_env(bundle)) as server:
        run_load(server.url, payloads, 20, 3.0, 0.0)
        rate = args.rate
        if rate is None:
            probe = _probe(server.url, payloads, args)
            if probe is None:
                return 1
            rate = probe["max_sustained_rate"] / 2
        report = soak(server.url, server.pid, catalogue.tolist(), rate=rate, minutes=args.minutes,
                      window_s=args.window, warmup_s=args.warmup, seed=args.seed)
        check_log(report, server)
    machine = {"cpus": os.cpu_count(), "load_avg_before": [round(x, 2) for x in load_before],
               "load_avg_after": [round(x, 2) for x in os.getloadavg()], "waited_for_idle_s": round(waited_s),
               "trainings_running_at_start": busy}
    return print_report(report, "offline.bench.faults.soak", out=args.out, bundle=str(bundle), machine=machine,
                        probe=probe)


if __name__ == "__main__":
    raise SystemExit(main())
