"""What waiting for a replica costs an append: latency with and without ``SEQREC_REDIS_WAIT_REPLICAS=1``.

    seqrec bench redis-wait [--appends 2000] [--rounds 5] [--out docs/results/store/redis-wait.json]

Starts a master and one replica of it (`offline.bench.lib.redis_cluster.ReplicatedRedis`, plain redis-servers on
free ports, nothing on disk) and times single-event appends through `service.http.store.RedisStore`, one after
another (each call's round trip as the service sees it), in ``--rounds`` alternating blocks of ``--appends`` with
WAIT off and WAIT 1 (so a busy moment of a shared machine falls on both). Prints a JSON report: median, p99 and
max per mode, the ratio of the medians, and how many WAIT appends the replica did not confirm in time (a 503 each).
It passes when every WAIT append was confirmed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from offline.bench.faults.reliability import Started, print_report
from offline.bench.lib.redis_cluster import ReplicatedRedis
from service.http.store import Event, RedisStore, StoreUnavailable

MAX_LEN = 50


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 3), "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
            "max": round(ordered[-1], 3), "n": len(ordered)}


async def _block(store: RedisStore, tag: str, appends: int) -> tuple[list[float], int]:
    times, unconfirmed = [], 0
    for k in range(appends):
        start = time.perf_counter()
        try:
            await store.append(f"{tag}-u{k % 100}", [Event(f"i{k}", float(k))], MAX_LEN)
        except StoreUnavailable:
            unconfirmed += 1
            continue
        times.append((time.perf_counter() - start) * 1000)
    return times, unconfirmed


async def redis_wait(url: str, appends: int, rounds: int, wait_ms: int) -> dict[str, Any]:
    stores = {"no_wait": RedisStore(url, timeout_ms=2000),
              "wait_1": RedisStore(url, timeout_ms=2000, wait_replicas=1, wait_ms=wait_ms)}
    times: dict[str, list[float]] = {mode: [] for mode in stores}
    unconfirmed = dict.fromkeys(stores, 0)
    try:
        for mode, store in stores.items():  # warm: connections opened, the script loaded
            await _block(store, f"warm-{mode}", 50)
        for r in range(rounds):
            for mode, store in stores.items():
                block, missed = await _block(store, f"{mode}-r{r}", appends)
                times[mode] += block
                unconfirmed[mode] += missed
    finally:
        for store in stores.values():
            await store.close()
    rows = {mode: {**_quantiles(values), "unconfirmed": unconfirmed[mode]} for mode, values in times.items()}
    ratio = rows["wait_1"]["median"] / max(rows["no_wait"]["median"], 1e-6)
    return {"bench": "redis-wait", "appends_per_block": appends, "rounds": rounds, "wait_ms": wait_ms,
            "append_ms": rows, "median_ratio_wait_to_no_wait": round(ratio, 2),
            "added_median_ms": round(rows["wait_1"]["median"] - rows["no_wait"]["median"], 3),
            "passed": unconfirmed["wait_1"] == 0 and unconfirmed["no_wait"] == 0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqrec bench redis-wait", description=__doc__.split("\n")[0])
    p.add_argument("--appends", type=int, default=2000, help="appends per block")
    p.add_argument("--rounds", type=int, default=5, help="blocks of each mode, alternating")
    p.add_argument("--wait-ms", type=int, default=100, help="WAIT's timeout (SEQREC_REDIS_WAIT_MS)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    return run_redis_wait(p.parse_args(argv))


def run_redis_wait(args: argparse.Namespace) -> int:
    started = Started()
    with tempfile.TemporaryDirectory(prefix="seqrec-redis-wait-") as tmp, ReplicatedRedis(Path(tmp)) as pair:
        report = asyncio.run(redis_wait(pair.master.url, args.appends, args.rounds, args.wait_ms))
    command = f"seqrec bench redis-wait --appends {args.appends} --rounds {args.rounds} --wait-ms {args.wait_ms}"
    command += f" --out {args.out}" if args.out else ""
    return print_report(report, __name__, out=args.out, command=command, **started.head())


if __name__ == "__main__":
    sys.exit(main())
