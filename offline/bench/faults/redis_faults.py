"""Kill Redis under steady mixed load and restart it: nothing acknowledged may be lost.

    python -m offline.bench.faults.redis_faults --artifacts /tmp/rel-artifacts --rate 60 \
        --before 20 --down 10 --after 20 [--out docs/results/reliability/redis-faults.json]

Serves ARTIFACTS/current (trained first with `seqrec pipeline --config CONFIG` when there is none)
with SEQREC_REDIS_URL pointing at a redis-server of this script's own on a free port (no RDB
snapshots; an append-only file in a temporary folder, fsynced on every write). Offers an open-loop
Poisson load mixing requests that carry their history, user_id-only requests and POST /events (a
unique item per event), kills Redis with SIGKILL --before seconds in, keeps it down --down seconds,
restarts it on the same port and keeps the load on --after seconds more. Prints a JSON report
(`offline.bench.faults.redis_faults.redis_faults`; also written to --out) and exits 1 when a target is
missed: history-carrying requests never fail; user_id-only requests and events get 503 during the
outage and 2xx before and after it; every event acknowledged with 2xx is in Redis afterwards; no
traceback in the server's log.
`tests/service/test_faults.py` runs the same scenario in small.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import SeqrecError
from offline.bench.faults.reliability import (
    Started,
    check_log,
    current_bundle,
    history_calls,
    print_report,
    scenario_parser,
    service_env,
    warmed_service,
)
from offline.bench.lib.load import Answer, Call, LoadRun, Marks, get_json, open_loop, post_json, summary
from offline.bench.lib.payloads import load_catalogue
from offline.bench.lib.processes import RedisProcess, free_port
from service.http.store_lua import user_keys

if TYPE_CHECKING:
    import aiohttp

PHASES = ("before", "outage", "transition", "after")

class _MixedLoad:
    """The calls of ``redis_faults``: history-carrying requests, user_id-only requests for readers whose
    histories are seeded first, and events of unique items spread over enough writers that none reaches
    max_len (an append trims a history to the model's max_len, which would drop events by design)."""

    KINDS = ("history", "user", "event")

    def __init__(self, url: str, catalogue: Sequence[str], *, max_len: int, shares: Sequence[float],
                 expected_events: float, n_readers: int, seed: int, headers: Mapping[str, str] | None) -> None:
        rng = np.random.default_rng(seed)
        self.tag = f"faults-{uuid.uuid4().hex[:8]}"
        items = np.asarray([str(i) for i in catalogue])
        self.readers = {f"{self.tag}-reader{n}": rng.choice(items, size=min(len(items), max_len, 20),
                                                            replace=False).tolist() for n in range(n_readers)}
        n_writers = max(3, math.ceil(2 * expected_events / max(1, max_len - 1)))  # twice as many as needed
        self.writers = [f"{self.tag}-writer{n}" for n in range(n_writers)]
        self.acked: dict[str, set[str]] = {user: set() for user in [*self.readers, *self.writers]}
        for user, history in self.readers.items():
            body = {"events": [{"user_id": user, "item_id": i} for i in history]}
            status, answer = post_json(url, "/events", body, headers)
            if status != 200:
                raise SeqrecError(f"seeding the history of {user} failed: HTTP {status} {answer}")
            self.acked[user].update(history)
        self.history_calls = history_calls(items.tolist(), seed)
        self.rng, self.weights = np.random.default_rng(seed + 1), np.asarray(shares) / sum(shares)
        self.n_events = 0

    def __call__(self, i: int) -> Call:
        """Called once per request, in order: the same seed gives the same mix."""
        kind = self.KINDS[int(self.rng.choice(3, p=self.weights))]
        if kind == "history":
            return self.history_calls[i % len(self.history_calls)]
        if kind == "user":
            readers = list(self.readers)
            body = {"user_id": readers[i % len(readers)], "k": 10}
            return Call("user", "POST", "/recommend", json.dumps(body).encode())
        item = f"{self.tag}-e{self.n_events}"
        user = self.writers[self.n_events % len(self.writers)]
        self.n_events += 1
        return Call("event", "POST", "/events", json.dumps({"user_id": user, "item_id": item}).encode(),
                    key=f"{user}\t{item}")

    def acknowledge(self, answers: Sequence[Answer]) -> None:
        for a in answers:
            if a.call.kind == "event" and a.error is None and a.call.key is not None:
                user, item = a.call.key.split("\t")
                self.acked[user].add(item)


def _fault_phase(a: Answer, marks: Marks) -> str:
    """before: answered before the kill; outage: sent once Redis was dead and answered before its restart
    began; after: sent once it answered PING again; transition: the rest (straddling a kill or a restart)."""
    if a.done < marks["kill"]:
        return "before"
    if a.sent >= marks["up"]:
        return "after"
    if a.sent >= marks["killed"] and a.done <= marks["restart"]:
        return "outage"
    return "transition"


def redis_faults(url: str, redis_server: RedisProcess, catalogue: Sequence[str], *, rate: float, before_s: float,
                 down_s: float, after_s: float, seed: int = 0, prefix: str = "seqrec:",
                 shares: tuple[float, float, float] = (0.5, 0.25, 0.25), n_readers: int = 8,
                 timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Kill Redis ``before_s`` into a mixed load (``shares`` of history-carrying requests, user_id-only
    requests and single events), keep it down ``down_s``, restart it, go on ``after_s`` more; then read
    back every user's list from Redis. The service must store histories under ``prefix`` in the Redis
    that ``redis_server`` runs, with persistence (a ``folder``) so that the check covers the events
    acknowledged before the kill too. Answers are classed by phase (``_fault_phase``)."""
    if redis_server.folder is None:
        raise SeqrecError("redis_faults needs a Redis with an append-only file (RedisProcess(folder=...)): "
                          "without one a restart loses what was acknowledged before the kill")
    max_len = int(get_json(url, "/readyz")["max_len"])
    mix = _MixedLoad(url, catalogue, max_len=max_len, shares=shares, n_readers=n_readers, seed=seed,
                     expected_events=rate * (before_s + down_s + after_s + 2) * shares[2] / sum(shares),
                     headers=headers)

    async def fault(session: aiohttp.ClientSession, marks: Marks) -> None:
        await asyncio.sleep(before_s)
        marks["kill"] = time.perf_counter()
        await asyncio.to_thread(redis_server.kill)
        marks["killed"] = time.perf_counter()
        await asyncio.sleep(down_s)
        marks["restart"] = time.perf_counter()
        await asyncio.to_thread(redis_server.start)
        marks["up"] = time.perf_counter()

    run = open_loop(url, mix, rate, action=fault, tail_s=after_s, seed=seed, timeout_s=timeout_s, headers=headers)
    mix.acknowledge(run.answers)
    events = _compare_with_redis(redis_server.url, prefix, mix.acked, run.answers, mix.writers)
    table, checks = _judge(run, events, max_len)
    marks = run.marks
    timeline = {"kill_at_s": round(marks["kill"] - run.start, 2),
                "down_s": round(marks["restart"] - marks["killed"], 2),
                "restart_took_s": round(marks["up"] - marks["restart"], 3),
                "load_s": round(run.answers[-1].due - run.start, 2) if run.answers else 0.0}
    return {
        "scenario": "redis_faults", "rate": rate, "shares": dict(zip(mix.KINDS, shares, strict=True)),
        "max_len": max_len, "writers": len(mix.writers), "readers": n_readers, "fault": timeline,
        "load": summary(run.answers), "by_kind": table, "events": events, "checks": checks,
        "passed": all(checks.values()),
    }


def _judge(run: LoadRun, events: Mapping[str, Any], max_len: int) -> tuple[dict[str, Any], dict[str, bool]]:
    """Answers by kind and phase (``_fault_phase``; "all": every phase together), and the scenario's checks."""
    groups: dict[tuple[str, str], list[Answer]] = {(kind, name): [] for kind in _MixedLoad.KINDS for name in PHASES}
    for a in run.answers:
        groups[a.call.kind, _fault_phase(a, run.marks)].append(a)
    table = {kind: {name: _counts(groups[kind, name]) for name in PHASES} for kind in _MixedLoad.KINDS}
    for kind in _MixedLoad.KINDS:
        table[kind]["all"] = _counts([a for name in PHASES for a in groups[kind, name]])
    store_kinds = ("user", "event")
    outage = [groups[k, "outage"] for k in store_kinds]
    checks = {
        "history_requests_never_failed": all(a.error is None for a in run.answers if a.call.kind == "history"),
        "store_requests_ok_before_and_after": all(a.error is None for k in store_kinds for name in ("before", "after")
                                                  for a in groups[k, name]),
        "store_requests_503_during_outage": all(group and all(a.status == 503 for a in group) for group in outage),
        "only_2xx_or_503": all(a.error is None or a.status == 503 for a in run.answers),
        "no_acknowledged_event_lost": events["lost"] == 0,
        "no_history_trimmed": events["longest_writer_history"] < max_len,
    }
    return table, checks


def _counts(answers: Sequence[Answer]) -> dict[str, Any]:
    return {**summary(answers), "n_503": sum(a.status == 503 for a in answers)}


def _compare_with_redis(redis_url: str, prefix: str, acked: Mapping[str, set[str]], answers: Sequence[Answer],
                        writers: Sequence[str]) -> dict[str, Any]:
    """Every acknowledged event against what each user's list in Redis holds. The writers' lists must stay
    shorter than max_len: an append trims a history to it, which would drop events by design."""
    import redis

    with redis.Redis.from_url(redis_url) as client:
        stored = {user: [json.loads(raw)["i"] for raw in client.lrange(user_keys(prefix, user)[0], 0, -1)]
                  for user in acked}
    lost = sorted((user, item) for user, items in acked.items() for item in items - set(stored[user]))
    sent = {tuple(a.call.key.split("\t")) for a in answers if a.call.kind == "event" and a.call.key}
    held = {(user, item) for user, items in stored.items() for item in items}
    failed = {tuple(a.call.key.split("\t")) for a in answers if a.call.kind == "event" and a.call.key and a.error}
    return {
        "acknowledged": sum(len(items) for items in acked.values()),  # seeded histories included
        "acknowledged_during_load": len(sent - failed),
        "refused": len(failed),
        "held_by_redis": len(held),
        "lost": len(lost),
        "lost_examples": [f"{user}: {item}" for user, item in lost[:10]],
        "refused_but_stored": len(failed & held),  # a 503 whose write went through after all
        "longest_writer_history": max((len(stored[user]) for user in writers), default=0),
    }


def parser() -> argparse.ArgumentParser:
    parser = scenario_parser(__doc__)
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second, all kinds together")
    parser.add_argument("--before", type=float, default=20.0, help="seconds of load before the kill")
    parser.add_argument("--down", type=float, default=10.0, help="seconds Redis stays down")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the restart")
    parser.add_argument("--mix", default="0.5,0.25,0.25", help="shares of history, user_id-only and event requests")
    return parser


def main(argv: list[str] | None = None) -> int:
    started = Started()
    argv = sys.argv[1:] if argv is None else argv
    options = parser()
    args = options.parse_args(argv)
    shares = tuple(float(x) for x in args.mix.split(","))
    if len(shares) != 3 or min(shares) < 0 or sum(shares) <= 0:
        options.error(f"--mix {args.mix!r}: three non-negative shares")

    bundle = current_bundle(args)
    catalogue = load_catalogue(bundle)
    with tempfile.TemporaryDirectory(prefix="seqrec-redis-faults-") as tmp:
        redis = RedisProcess(free_port(), Path(tmp) / "redis")
        with redis, warmed_service(service_env(bundle, redis_url=redis.url), catalogue, min(args.rate, 50)) as server:
            report = redis_faults(server.url, redis, catalogue.tolist(), rate=args.rate, before_s=args.before,
                                  down_s=args.down, after_s=args.after, seed=args.seed,
                                  shares=(shares[0], shares[1], shares[2]))
            check_log(report, server)
    return print_report(report, "offline.bench.faults.redis_faults", argv, args.out, **started.head(),
                        bundle=str(bundle))


if __name__ == "__main__":
    raise SystemExit(main())
