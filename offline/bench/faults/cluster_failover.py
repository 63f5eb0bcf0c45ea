"""A Redis Cluster master killed under load: what clients get over HTTP, and how many acknowledged events survive.

    seqrec bench cluster-failover --artifact BUNDLE [--rate 100] [--before 10] [--after 20] [--wait 0]
        [--out docs/results/reliability/cluster-failover.json]

Starts a Redis Cluster of 3 masters and 3 replicas (`offline.bench.lib.redis_cluster`, cluster-node-timeout
``--node-timeout-ms``, nothing on disk: the replicas are the copies) and the service on it (a real uvicorn
process, ``SEQREC_REDIS_URL=redis+cluster://...``, ``SEQREC_REDIS_WAIT_REPLICAS=--wait``). Offers an open-loop
Poisson load: half ``POST /events`` (a unique item per event, spread over enough users that none reaches the
model's max_len, which would trim events by design), half ``POST /recommend`` by those users' ids. ``--before``
seconds in, it SIGKILLs a master (not the node the URL names), waits until the cluster is whole again (its
replica promoted) and keeps the load on ``--after`` seconds more. Then it reads every user's history from the
cluster and counts the acknowledged events (2xx) that are missing. Prints a JSON report; it passes when every
answer was a 2xx or a 503 (no 500, no dropped connection), the store's routes were all 2xx again after the
failover, and no traceback is in the server's log. Lost acknowledged events are reported, not judged: without
WAIT, replication is asynchronous and a few may be lost by design; ``--wait 1`` is the setting that bounds it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offline.bench.faults.reliability import (
    Started,
    add_check,
    check_log,
    log_problems,
    print_report,
    service_env,
)
from offline.bench.lib.load import Answer, Call, Marks, get_json, open_loop, summary
from offline.bench.lib.processes import SERVICE_APP, start_server_process
from offline.bench.lib.redis_cluster import RedisClusterProcesses
from service.http.store import RedisStore

if TYPE_CHECKING:
    import aiohttp


class _Load:
    def __init__(self, max_len: int, expected_events: float) -> None:
        self.tag = f"failover-{uuid.uuid4().hex[:6]}"
        n_writers = max(3, math.ceil(2 * expected_events / max(1, max_len - 1)))
        self.writers = [f"{self.tag}-w{n}" for n in range(n_writers)]
        self.n_events = 0

    def __call__(self, i: int) -> Call:
        if i % 2:
            body = {"user_id": self.writers[i % len(self.writers)], "k": 10}
            return Call("recommend", "POST", "/recommend", json.dumps(body).encode())
        item, user = f"{self.tag}-e{self.n_events}", self.writers[self.n_events % len(self.writers)]
        self.n_events += 1
        return Call("event", "POST", "/events", json.dumps({"user_id": user, "item_id": item}).encode(),
                    key=f"{user}\t{item}")


def _phase(a: Answer, marks: Marks) -> str:
    if a.done < marks["kill"]:
        return "before"
    return "after" if a.sent >= marks["whole"] else "failover"


def _statuses(answers: list[Answer]) -> dict[str, int]:
    return dict(sorted(Counter(str(a.status) if a.status is not None else a.error or "none"
                               for a in answers).items()))


async def _stored(url: str, users: list[str]) -> dict[str, set[str]]:
    store = RedisStore(url, timeout_ms=5000)
    try:
        return {user: {e.item_id for e in await store.history(user)} for user in users}
    finally:
        await store.close()


def cluster_failover(url: str, cluster: RedisClusterProcesses, *, rate: float, before_s: float, after_s: float,
                     seed: int) -> dict[str, Any]:
    max_len = int(get_json(url, "/readyz")["max_len"])
    load = _Load(max_len, rate * (before_s + after_s + 15) / 2)
    victim = next(n for n in cluster.masters() if n is not cluster.nodes[0])

    async def fault(session: aiohttp.ClientSession, marks: Marks) -> None:
        await asyncio.sleep(before_s)
        marks["kill"] = time.perf_counter()
        await asyncio.to_thread(victim.kill)
        while not await asyncio.to_thread(whole, cluster):
            await asyncio.sleep(0.05)
        marks["whole"] = time.perf_counter()

    run = open_loop(url, load, rate, action=fault, tail_s=after_s, seed=seed, timeout_s=5.0)
    acked = [tuple(a.call.key.split("\t")) for a in run.answers
             if a.call.kind == "event" and a.error is None and a.call.key]
    stored = asyncio.run(_stored(cluster.url, load.writers))
    lost = [(user, item) for user, item in acked if item not in stored[user]]
    phases: dict[str, dict[str, Any]] = {}
    for name in ("before", "failover", "after"):
        for kind in ("event", "recommend"):
            group = [a for a in run.answers if a.call.kind == kind and _phase(a, run.marks) == name]
            phases.setdefault(name, {})[kind] = {**summary(group), "statuses": _statuses(group)}
    report: dict[str, Any] = {
        "bench": "cluster-failover", "rate": rate, "max_len": max_len, "writers": len(load.writers),
        "killed_master_port": victim.port, "node_timeout_ms": cluster.node_timeout_ms,
        "failover_s": round(run.marks["whole"] - run.marks["kill"], 2), "statuses": _statuses(run.answers),
        "by_phase": phases,
        "events": {"acknowledged": len(acked), "lost": len(lost),
                   "lost_share": round(len(lost) / max(1, len(acked)), 5),
                   "lost_examples": [f"{u}: {i}" for u, i in lost[:10]],
                   "longest_history": max((len(items) for items in stored.values()), default=0)},
        "checks": {},
    }
    add_check(report, "only_2xx_or_503", all(a.error is None or a.status == 503 for a in run.answers))
    add_check(report, "all_2xx_after_failover", all(a.error is None for a in run.answers
                                                    if _phase(a, run.marks) == "after"))
    add_check(report, "no_history_trimmed", report["events"]["longest_history"] < max_len)
    return report


def whole(cluster: RedisClusterProcesses) -> bool:
    """Every master's slots served again (a replica promoted for a killed one), every live node agreeing."""
    try:
        return len(cluster.masters()) == cluster.n_masters and cluster.healthy()
    except Exception:  # a node mid-change: ask again
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqrec bench cluster-failover", description=__doc__.split("\n")[0])
    add_cluster_failover_options(p)
    return run_cluster_failover(p.parse_args(argv))


def add_cluster_failover_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--artifact", type=Path, required=True, help="the bundle to serve")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (half events, half reads)")
    p.add_argument("--before", type=float, default=10.0, help="seconds of load before the kill")
    p.add_argument("--after", type=float, default=20.0, help="seconds of load once the cluster is whole again")
    p.add_argument("--wait", type=int, default=0, help="SEQREC_REDIS_WAIT_REPLICAS of the service")
    p.add_argument("--node-timeout-ms", type=int, default=2000, help="cluster-node-timeout: failure detection")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")


def run_cluster_failover(args: argparse.Namespace) -> int:
    started = Started()
    with tempfile.TemporaryDirectory(prefix="seqrec-cluster-failover-") as tmp, RedisClusterProcesses(
            Path(tmp), masters=3, replicas=1, node_timeout_ms=args.node_timeout_ms) as cluster:
        env = service_env(args.artifact, redis_url=cluster.url, redis_wait_replicas=str(args.wait),
                          redis_timeout_ms="500")
        with start_server_process(SERVICE_APP, env) as server:
            report = cluster_failover(server.url, cluster, rate=args.rate, before_s=args.before,
                                      after_s=args.after, seed=args.seed)
            check_log(report, server)
            report["server_log_problems"] = [text[-3000:] for text in log_problems(server.log)]
    command = (f"seqrec bench cluster-failover --artifact {args.artifact} --rate {args.rate:g} --before "
               f"{args.before:g} --after {args.after:g} --wait {args.wait} --node-timeout-ms {args.node_timeout_ms}")
    command += f" --seed {args.seed}" if args.seed else ""
    command += f" --out {args.out}" if args.out else ""
    return print_report(report, __name__, out=args.out, command=command, wait_replicas=args.wait, **started.head())


if __name__ == "__main__":
    sys.exit(main())
