"""Faults under open-loop load, against a real service process: each scenario returns a JSON-ready
report with its figures and the checks it passed.

- ``redis_faults``: Redis is killed (SIGKILL) and restarted on the same port while requests that carry
  their history, user_id-only requests and ``POST /events`` keep coming; every acknowledged event must
  be in Redis afterwards (Redis runs with an append-only file fsynced on every write, so a kill -9
  loses nothing it acknowledged).
- ``bad_push``: broken bundles (``broken_copy``) are published and reloaded, then a good one.

`offline/bench/redis_faults.py` and `offline/bench/bad_push.py` run them at full length, `tests/service/test_faults.py`
short versions of the same code; the bench scripts' shared plumbing is at the end. The load is open
loop (`offline.bench.open_loop`): request i is due at a time fixed in advance and its latency counts from then.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from offline.bench.open_loop import Answer, Call, Marks, get_json, open_loop, post_json, summary
from offline.bench.serve import payloads_from_catalogue
from retriever.errors import SeqrecError

if TYPE_CHECKING:
    import aiohttp


def history_calls(catalogue: Sequence[str], seed: int, keep: bool = False) -> list[Call]:
    """POST /recommend bodies with 5-50 random catalogue items each."""
    n_items = len(catalogue)
    payloads = payloads_from_catalogue(np.asarray(catalogue), 200, min(5, n_items), min(50, n_items), seed)
    return [Call("history", "POST", "/recommend", json.dumps(p).encode(), keep=keep) for p in payloads]


# --------------------------------------------------------------------------- a Redis to kill


class RedisProcess:
    """A redis-server of our own on 127.0.0.1:``port``, killed with SIGKILL and restarted on the same port.

    With ``folder``, it keeps an append-only file there, fsynced before each write is acknowledged
    (``appendfsync always``): a restart reloads everything it ever acknowledged. Without, nothing
    touches the disk and a restart comes back empty. No RDB snapshots either way."""

    def __init__(self, port: int, folder: Path | None = None, binary: str = "redis-server") -> None:
        found = shutil.which(binary)
        if found is None:
            raise SeqrecError(f"{binary}: not found (install Redis, or pass the redis-server binary)")
        self.binary, self.port, self.folder = found, port, folder
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.folder is None:
            return [*command, "--appendonly", "no"]
        return [*command, "--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always"]

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it and wait until it answers PING (its append-only file loaded)."""
        import redis

        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        with redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError):
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise SeqrecError(f"redis-server did not start on port {self.port} ({' '.join(self.command())})")
                time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients, no last write to disk."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# --------------------------------------------------------------------------- Redis killed under load


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
    phases = ("before", "outage", "transition", "after")
    groups: dict[tuple[str, str], list[Answer]] = {(kind, name): [] for kind in mix.KINDS for name in phases}
    for a in run.answers:
        groups[a.call.kind, _fault_phase(a, run.marks)].append(a)
    table = {kind: {name: {**summary(groups[kind, name]), "n_503": sum(a.status == 503 for a in groups[kind, name])}
                    for name in phases} for kind in mix.KINDS}
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


def _compare_with_redis(redis_url: str, prefix: str, acked: Mapping[str, set[str]], answers: Sequence[Answer],
                        writers: Sequence[str]) -> dict[str, Any]:
    """Every acknowledged event against what each user's list in Redis holds. The writers' lists must stay
    shorter than max_len: an append trims a history to it, which would drop events by design."""
    import redis

    with redis.Redis.from_url(redis_url) as client:
        stored = {user: [json.loads(raw)["i"] for raw in client.lrange(f"{prefix}history:{user}", 0, -1)]
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


# --------------------------------------------------------------------------- bad model pushes


BREAKS: dict[str, str] = {  # kind -> what the refusal must say (after the file's path)
    "truncated": "retriever.pt: checksum does not match the manifest",
    "checksum": "items.faiss: checksum does not match the manifest",
    "shapes": "retriever.pt: does not fit the config's model",
    "incomplete": "items.faiss: listed in the manifest but missing",
}


def broken_copy(bundle: Path, dest: Path, kind: str) -> str:
    """Copy ``bundle`` to ``dest`` and break it; returns the reason a reload must give.

    truncated: retriever.pt cut to half its size (an interrupted copy). checksum: one byte of
    items.faiss flipped, the size unchanged. shapes: config.json's d_model doubled with its checksum
    rewritten, so every checksum passes and only loading the weights can tell. incomplete: items.faiss
    missing."""
    if kind not in BREAKS:
        raise SeqrecError(f"unknown break {kind!r}; expected one of {', '.join(BREAKS)}")
    shutil.copytree(bundle, dest)
    return break_bundle(dest, kind)


def break_bundle(dest: Path, kind: str) -> str:
    """Break the bundle in ``dest`` in place, as `broken_copy` describes; returns what refuses it."""
    from retriever.atomic import sha256_file

    if kind not in BREAKS:
        raise SeqrecError(f"unknown break {kind!r}; expected one of {', '.join(BREAKS)}")
    if kind == "truncated":
        weights = dest / "retriever.pt"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "checksum":
        index = dest / "items.faiss"
        data = bytearray(index.read_bytes())
        data[len(data) // 2] ^= 0xFF
        index.write_bytes(bytes(data))
    elif kind == "shapes":
        config_file, manifest_file = dest / "config.json", dest / "manifest.json"
        config = json.loads(config_file.read_text())
        config["model"]["d_model"] *= 2
        config_file.write_text(json.dumps(config, indent=2))
        manifest = json.loads(manifest_file.read_text())
        manifest["sha256"]["config.json"] = sha256_file(config_file)
        manifest_file.write_text(json.dumps(manifest, indent=2))
    else:
        (dest / "items.faiss").unlink()
    return BREAKS[kind]


def bundle_version(bundle: Path) -> str:
    return str(json.loads((bundle / "manifest.json").read_text())["version"])


def bad_push(url: str, artifacts: Path, good: Path, broken: Mapping[str, tuple[Path, str]], new: Path,
             catalogue: Sequence[str], *, rate: float, lead_s: float = 2.0, gap_s: float = 1.0, tail_s: float = 3.0,
             seed: int = 0, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Under a steady load of history-carrying requests to the service on ``artifacts`` (serving ``good``):
    for each broken bundle, point ``current`` at it, POST /admin/reload (which must answer 409 with the
    expected reason), point ``current`` back; then publish ``new`` the same way (200). Every request
    must be answered 2xx, by ``good`` until the good push and by ``new`` once its reload returned."""
    from offline.jobs.pipeline import switch_current

    v_good, v_new = bundle_version(good), bundle_version(new)
    served = get_json(url, "/readyz")["model_version"]
    if served != v_good:
        raise SeqrecError(f"the service serves {served}, not {v_good} ({good}); point {artifacts}/current at it")
    calls = history_calls(catalogue, seed, keep=True)
    reload_timeout = _reload_timeout()

    async def reload(session: aiohttp.ClientSession) -> tuple[int, dict[str, Any], float]:
        start = time.perf_counter()
        async with session.post("/admin/reload", timeout=reload_timeout) as response:
            return response.status, await response.json(), time.perf_counter() - start

    async def push(session: aiohttp.ClientSession, marks: Marks) -> dict[str, Any]:
        pushes: dict[str, Any] = {}
        await asyncio.sleep(lead_s)
        for name, (path, reason) in broken.items():
            switch_current(artifacts, path)
            try:
                status, body, seconds = await reload(session)
            finally:
                switch_current(artifacts, good)
            detail = str(body.get("detail", ""))
            pushes[name] = {"http_status": status, "detail": detail, "expected_reason": reason,
                            "seconds": round(seconds, 3),
                            "refused_with_reason": status == 409 and reason in detail
                            and str(path.resolve()) in detail
                            and detail.startswith(f"bundle refused, still serving {v_good}: ")}
            await asyncio.sleep(gap_s)
        switch_current(artifacts, new)
        marks["good_push"] = time.perf_counter()
        status, body, seconds = await reload(session)
        marks["reloaded"] = time.perf_counter()
        pushes["good"] = {"http_status": status, "seconds": round(seconds, 3), "answer": body}
        return pushes

    run = open_loop(url, lambda i: calls[i % len(calls)], rate, action=push, tail_s=tail_s, seed=seed,
                    timeout_s=timeout_s, headers=headers)
    pushes: dict[str, Any] = run.result

    def version(a: Answer) -> str | None:
        return str(json.loads(a.body)["model_version"]) if a.error is None and a.body else None

    before = Counter(version(a) for a in run.answers if a.done < run.marks["good_push"])
    after = Counter(version(a) for a in run.answers if a.sent >= run.marks["reloaded"])
    good_push, answer = pushes["good"], pushes["good"]["answer"]
    checks = {
        **{f"{name}_refused_with_reason": pushes[name]["refused_with_reason"] for name in broken},
        "good_bundle_reloaded": good_push["http_status"] == 200 and answer.get("model_version") == v_new
        and answer.get("previous_version") == v_good,
        "old_model_served_until_good_push": set(before) == {v_good},
        "new_model_served_after_reload": set(after) == {v_new},
        "no_failed_request": all(a.error is None for a in run.answers),
    }
    return {"scenario": "bad_push", "rate": rate, "good": v_good, "new": v_new, "pushes": pushes,
            "load": summary(run.answers), "versions_before_good_push": dict(before),
            "versions_after_reload": dict(after), "checks": checks, "passed": all(checks.values())}


def _reload_timeout() -> aiohttp.ClientTimeout:
    import aiohttp

    return aiohttp.ClientTimeout(total=300)  # loading and smoke-testing a real bundle takes seconds, not 2


# --------------------------------------------------------------------------- bundles for the scripts


def published_versions(artifacts: Path) -> list[Path]:
    """ARTIFACTS/versions/* holding a manifest, oldest first (by the manifest's created_at)."""
    folder = artifacts / "versions"
    found = [p for p in folder.iterdir() if (p / "manifest.json").is_file()] if folder.is_dir() else []
    return sorted(found, key=lambda p: (json.loads((p / "manifest.json").read_text()).get("created_at", ""), p.name))


def ensure_versions(artifacts: Path, config: Path, n: int, threads: int = 1) -> list[Path]:
    """At least ``n`` published versions in ARTIFACTS: `seqrec pipeline --config CONFIG` runs until there are."""
    while len(versions := published_versions(artifacts)) < n:
        command = [sys.executable, "-m", "offline.cli", "pipeline", "--config", str(config), "--out", str(artifacts),
                   "--threads", str(threads), "-q"]
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            raise SeqrecError(f"`{' '.join(command)}` failed")
    return versions


def service_env(artifacts: Path, **settings: str) -> dict[str, str]:
    """SEQREC_* variables of a one-thread service on ``artifacts``."""
    return {"SEQREC_ARTIFACTS": str(artifacts), "SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1",
            "SEQREC_LOG_LEVEL": "warning", **{f"SEQREC_{k.upper()}": v for k, v in settings.items()}}


def log_problems(log: Path) -> list[str]:
    """Tracebacks in a server's output."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [text[-5000:]] if "Traceback" in text or "Exception in ASGI application" in text else []


def add_check(report: dict[str, Any], name: str, ok: bool) -> None:
    report["checks"][name] = ok
    report["passed"] = all(report["checks"].values())


def print_report(report: Mapping[str, Any]) -> int:
    """The report as JSON on stdout; the exit status: 0 when it passed."""
    print(json.dumps(report, indent=2, default=str))
    return 0 if report.get("passed") else 1
