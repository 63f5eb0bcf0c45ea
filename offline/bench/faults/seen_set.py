"""One user with a large seen set must not slow Redis for everyone: an append's Redis time against the seen set's size.

    seqrec bench seen-set [--sizes 10,100,1000,10000] [--appends 200] [--out docs/results/store/seen-set.json]

Starts a redis-server of its own on a free port. For each size N, one user gets N distinct items in batches of
1,000 events, all at one timestamp (the worst case: every event cut from the window ties, so the store keeps all
of them to recognise a replay), then ``--appends`` single-event appends at that timestamp through
`service.http.store.RedisStore`. Redis's own time for each append script comes from its SLOWLOG (threshold 0:
every command, in microseconds, measured inside Redis). Meanwhile another client, in a process of its own, PINGs
in a loop; its round trips during those appends are the other clients' latency. Prints a JSON report and exits 1
when the append's median at the largest size exceeds 3 x the smallest's, or the PING p99 at the largest size
exceeds 3 x the smallest's plus 1 ms (flat, not linear: linear is 1,000 x from 10 to 10,000).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from offline.bench.faults.reliability import print_report
from offline.bench.lib.processes import RedisProcess, free_port
from service.http.store import Event, RedisStore

SIZES = (10, 100, 1000, 10000)
MAX_LEN = 50
TIE = 1_700_000_000.0
SLOWLOG_LEN = 1_000_000


def _pinger(url: str, ready: Any, stop: Any, out: Any) -> None:
    """Another client, in a process of its own (no GIL shared with the appending one): PING round trips in ms."""
    times = []
    with redis.Redis.from_url(url) as client:
        client.ping()
        ready.set()
        while not stop.is_set():
            start = time.perf_counter()
            client.ping()
            times.append((time.perf_counter() - start) * 1000)
            time.sleep(0.0005)
    out.put(times)


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 3), "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
            "max": round(ordered[-1], 3), "n": len(ordered)}


async def _one_size(store: RedisStore, admin: redis.Redis, url: str, size: int, appends: int) -> dict[str, Any]:
    user = f"bench-{size}"
    for start in range(0, size, 1000):
        await store.append(user, [Event(f"i{k}", TIE) for k in range(start, min(size, start + 1000))], MAX_LEN)
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", SLOWLOG_LEN)  # the script's own commands are logged too (Redis 7)
    admin.slowlog_reset()
    context = multiprocessing.get_context("spawn")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    pinger = context.Process(target=_pinger, args=(url, ready, stop, out))
    pinger.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the PING client did not start")
        for k in range(appends):
            await store.append(user, [Event(f"new{k}", TIE)], MAX_LEN)
    finally:
        stop.set()
        pings = out.get(timeout=30)
        pinger.join()
    entries = admin.slowlog_get(SLOWLOG_LEN)
    admin.config_set("slowlog-log-slower-than", 10000)
    script_us = [e["duration"] for e in entries if str(e["command"]).upper().lstrip("B'\"").startswith("EVALSHA")]
    seen = len((await store.read(user)).seen)
    if len(script_us) != appends:
        raise RuntimeError(f"SLOWLOG kept {len(script_us)} of the {appends} append scripts")
    return {"seen_items": seen, "append_redis_ms": _quantiles([us / 1000 for us in script_us]),
            "ping_ms": _quantiles(pings)}


async def seen_set(sizes: tuple[int, ...], appends: int) -> dict[str, Any]:
    with RedisProcess(free_port()) as server:
        store = RedisStore(server.url, timeout_ms=5000, seen_cap=max(sizes) + appends)
        admin = redis.Redis.from_url(server.url)
        try:
            rows = [{"size": size, **await _one_size(store, admin, server.url, size, appends)} for size in sizes]
        finally:
            admin.close()
            await store.close()
    first, last = rows[0], rows[-1]
    ratio = last["append_redis_ms"]["median"] / max(first["append_redis_ms"]["median"], 1e-6)
    flat = ratio <= 3.0
    unaffected = last["ping_ms"]["p99"] <= 3 * first["ping_ms"]["p99"] + 1.0
    return {"bench": "seen-set", "max_len": MAX_LEN, "appends_per_size": appends, "events": "one timestamp",
            "rows": rows, "append_median_ratio_largest_to_smallest": round(ratio, 2),
            "passed": flat and unaffected, "flat": flat, "ping_unaffected": unaffected}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqrec bench seen-set", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="seen-set sizes, comma-separated")
    p.add_argument("--appends", type=int, default=200, help="single-event appends timed per size")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    return run_seen_set(p.parse_args(argv))


def run_seen_set(args: argparse.Namespace) -> int:
    sizes = tuple(int(s) for s in str(args.sizes).split(","))
    report = asyncio.run(seen_set(sizes, args.appends))
    command = f"seqrec bench seen-set --sizes {args.sizes} --appends {args.appends}"
    command += f" --out {args.out}" if args.out else ""
    return print_report(report, __name__, out=args.out, command=command)


if __name__ == "__main__":
    sys.exit(main())
