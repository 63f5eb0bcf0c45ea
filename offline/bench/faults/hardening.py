"""Secure by default, one client cannot hold a worker, honest health: each promise of issue 66 (items 1, 4 and 5)
tried against `seqrec serve` as the image runs it, over real sockets.

    seqrec bench hardening --artifact BUNDLE [--deadline 3] [--cap 16] [--out docs/results/reliability/hardening.json]

1. start-up: `seqrec serve --host 0.0.0.0` without a key, and with keys of 1 and 15 characters, must exit 1 with
   one line before listening; `--insecure-no-key` must start.
2. a key-less server on 127.0.0.1: Host headers other than its localhost names get 400 (a write among them).
3. slow clients: clients trickling one byte every 1.5 s (two in the body, two in the headers) must get 408 within
   the read deadline while a steady client's /recommend latency is measured beside them (and, first, alone).
4. the connection cap: with cap - 1 idle connections held a request gets 503; once the deadline has closed them,
   200 again.
5. readiness: a redis-server of the bench's own, killed: /readyz must answer 503 (and 200 again after a restart),
   /healthz 200 throughout; no answer may name Redis's address or the bundle's folder; two JSON-logging workers
   must each log their start-up info line and the outage warning with level and logger.
Prints a JSON report; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx

from offline.bench.faults.reliability import Started, print_report
from offline.bench.lib.processes import RedisProcess, SeqrecServeProcess, free_port, listening

KEY = "hardening-bench-key-0123456789"
TRICKLE_EVERY_S = 1.5
# (sent at once, then trickled): the whole header then a body of spaces, or the request line then more header
BODY = (b"POST /recommend HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 200"
        b"\r\n\r\n", b" " * 200)
HEADERS = (b"GET /healthz HTTP/1.1\r\n", b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 200)


def _env(bundle: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQREC_")}
    env.update({"SEQREC_ARTIFACTS": str(bundle), "SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1"})
    return {**env, **{f"SEQREC_{k.upper()}": v for k, v in settings.items()}}


@contextmanager
def _serving(bundle: Path, workdir: Path, name: str, **settings: str) -> Iterator[SeqrecServeProcess]:
    server = SeqrecServeProcess(_env(bundle, **settings), workdir / f"{name}.log", cwd=workdir)
    try:
        yield server.launch().wait_ready(300)
    finally:
        server.stop()


def _quantiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"p50": round(statistics.median(ordered), 2), "p99": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


# --------------------------------------------------------------------------- 1. start-up


def refused_starts(bundle: Path, workdir: Path) -> dict[str, Any]:
    """Each refused configuration: its exit status, its one line, the seconds to exit, whether it listened."""
    cases = {"no_key_off_loopback": {}, "key_of_1_character": {"api_key": "k"},
             "key_of_15_characters": {"api_key": "k" * 15}}
    rows: dict[str, dict[str, Any]] = {}
    for name, settings in cases.items():
        port = free_port()
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "offline.cli", "serve", "--host", "0.0.0.0", "--port", str(port)],
                              env=_env(bundle, **settings), cwd=workdir, capture_output=True, text=True, timeout=300,
                              check=False)
        lines = done.stderr.strip().splitlines()
        rows[name] = {"exit": done.returncode, "seconds": round(time.perf_counter() - start, 2),
                      "stderr_lines": len(lines), "message": lines[-1] if lines else "",
                      "listened": listening(port)}
    open_server = SeqrecServeProcess(_env(bundle), workdir / "insecure.log", host="0.0.0.0", cwd=workdir,
                                     options=("--insecure-no-key",))
    try:
        open_server.launch().wait_ready(300)
        insecure_started = True
    finally:
        open_server.stop()
    ok = all(r["exit"] == 1 and r["stderr_lines"] == 1 and not r["listened"] for r in rows.values())
    ok = ok and all(w in rows["no_key_off_loopback"]["message"] for w in ("SEQREC_API_KEY_FILE", "--insecure-no-key"))
    return {"refused": rows, "insecure_no_key_started": insecure_started, "ok": ok and insecure_started}


# --------------------------------------------------------------------------- 2. Host allow-list


def foreign_hosts(url: str) -> dict[str, Any]:
    foreign = "rebound.attacker.example"
    with httpx.Client(base_url=url, timeout=10) as client:
        refused = {f"{method} {path}": client.request(method, path, headers={"Host": foreign}).status_code
                   for method, path in (("GET", "/healthz"), ("DELETE", "/admin/items/i5"), ("POST", "/events"),
                                        ("POST", "/recommend"))}
        local = {host: client.get("/healthz", headers={"Host": host}).status_code
                 for host in ("localhost", "127.0.0.1", "[::1]")}
    return {"foreign_host": foreign, "foreign": refused, "local": local,
            "ok": set(refused.values()) == {400} and set(local.values()) == {200}}


# --------------------------------------------------------------------------- 3. slow clients


def trickle(port: int, request: tuple[bytes, bytes], limit_s: float) -> dict[str, Any]:
    """``request[0]`` at once, then ``request[1]`` one byte every 1.5 s until the server answers or closes: the
    seconds it took and the status line."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(TRICKLE_EVERY_S)
        start, answer, sent = time.monotonic(), b"", 0
        sock.sendall(request[0])
        for byte in request[1]:
            if time.monotonic() - start > limit_s:
                break
            try:
                sock.sendall(bytes([byte]))
                sent += 1
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            answer += chunk
            if not chunk or b"\r\n" in answer:
                break
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
    return {"seconds": round(time.monotonic() - start, 2), "bytes_sent": sent, "answer": status}


def steady(url: str, seconds: float, every_s: float = 0.05) -> dict[str, Any]:
    """POST /recommend one after the other (``every_s`` apart) for ``seconds``: statuses and latency (ms)."""
    latencies, statuses = [], []
    body = {"history": ["i1", "i2", "i3"], "k": 5}
    with httpx.Client(base_url=url, timeout=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            statuses.append(client.post("/recommend", json=body).status_code)
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(every_s)
    return {"statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}, "latency_ms": _quantiles(latencies)}


def slow_clients(server: SeqrecServeProcess, deadline_s: float) -> dict[str, Any]:
    window = deadline_s + TRICKLE_EVERY_S + 1.0
    alone = steady(server.url, window)
    cut: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda r=r, kind=kind: cut.append({"kind": kind, **trickle(
        server.port, r, 10 * deadline_s)})) for kind, r in (("body", BODY), ("body", BODY), ("headers", HEADERS),
                                                            ("headers", HEADERS))]
    for thread in threads:
        thread.start()
    beside = steady(server.url, window)
    for thread in threads:
        thread.join()
    ok = (all(c["answer"].startswith("HTTP/1.1 408") and c["seconds"] <= deadline_s + TRICKLE_EVERY_S + 0.5
              for c in cut) and set(beside["statuses"]) == {"200"})
    ratio = round(beside["latency_ms"]["p50"] / alone["latency_ms"]["p50"], 2)
    return {"deadline_s": deadline_s, "trickle_every_s": TRICKLE_EVERY_S, "slow_clients": cut,
            "steady_client_alone": alone, "steady_client_beside_slow_ones": beside, "p50_ratio_beside_to_alone": ratio,
            "ok": ok}


# --------------------------------------------------------------------------- 4. connection cap


def connection_cap(server: SeqrecServeProcess, cap: int, deadline_s: float) -> dict[str, Any]:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(cap - 1)]
    try:
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            at_cap = client.get("/healthz").status_code
        time.sleep(deadline_s + 1.0)  # the deadline closes the idle ones
        closed = 0
        for sock in idle:
            sock.settimeout(1.0)
            with suppress(OSError):
                closed += sock.recv(4096).startswith(b"HTTP/1.1 408")
        with httpx.Client(base_url=server.url, timeout=10) as client:
            after = client.get("/healthz").status_code
    finally:
        for sock in idle:
            sock.close()
    return {"cap": cap, "idle_connections_held": cap - 1, "status_at_cap": at_cap,
            "idle_closed_with_408_by_the_deadline": closed, "status_after": after,
            "ok": at_cap == 503 and closed == cap - 1 and after == 200}


# --------------------------------------------------------------------------- 5. readiness, leaks, logs


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return round(time.monotonic() - start, 2)
        time.sleep(0.05)
    return None


def readiness(bundle: Path, workdir: Path) -> dict[str, Any]:
    redis_server = RedisProcess(free_port())
    redis_server.start()
    try:
        with _serving(bundle, workdir, "readiness", redis_url=redis_server.url, api_key=KEY, workers="2",
                      log_format="json", redis_timeout_ms="250") as server, \
                httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as client:
            def started() -> int:
                return int(worker_logs(server.log.read_text(errors="replace"))["workers_logging_start_up_info"])

            both_started = _wait_for(lambda: started() == 2, 300)  # ready means one worker is; wait for the other
            before = client.get("/readyz").status_code
            redis_server.kill()
            to_503 = _wait_for(lambda: client.get("/readyz").status_code == 503, 30)
            down = [client.get("/readyz"), client.get("/healthz"),
                    client.post("/events", json={"user_id": "u", "item_id": "i1"}),
                    client.post("/recommend", json={"user_id": "u"}), client.get("/users/u/history")]
            redis_server.start()
            to_200 = _wait_for(lambda: client.get("/readyz").status_code == 200, 30)
            time.sleep(0.5)
            log = server.log.read_text(errors="replace")
    finally:
        redis_server.kill()
    named = ("127.0.0.1", f":{redis_server.port}", str(bundle), str(bundle.resolve()))
    leaks = [f"{r.request.method} {r.request.url.path}" for r in down if any(n in r.text for n in named)]
    statuses = {f"{r.request.method} {r.request.url.path}": r.status_code for r in down}
    logs = worker_logs(log)
    ok = (before == 200 and to_503 is not None and to_200 is not None and statuses["GET /healthz"] == 200
          and not leaks and logs["ok"])
    return {"seconds_until_both_workers_started": both_started, "readyz_before": before,
            "seconds_to_readyz_503": to_503, "while_down": statuses,
            "readyz_body_while_down": down[0].json(), "event_503_body": down[2].json(),
            "seconds_to_readyz_200_after_restart": to_200, "answers_naming_redis_port_or_bundle_folder": leaks,
            "logs": logs, "ok": ok}


def worker_logs(log: str) -> dict[str, Any]:
    """What two JSON-logging workers wrote: each one's start-up info line, and warnings with level and logger."""
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    other = [line for line in log.splitlines() if line.strip() and not line.startswith("{")]
    started = {e["pid"] for e in lines if e["logger"] == "seqrec.service" and e["level"] == "INFO"
               and e["message"].startswith("serving ")}
    outage = {e["pid"] for e in lines if e["level"] == "WARNING" and "history store unavailable" in e["message"]}
    fields = all({"time", "level", "logger", "pid", "message"} <= set(e) for e in lines)
    return {"json_lines": len(lines), "other_lines": other[:5], "workers_logging_start_up_info": len(started),
            "workers_logging_the_outage_warning": len(outage), "every_line_has_level_logger_pid": fields,
            "ok": len(started) == 2 and len(outage) >= 1 and fields}


def hardening_bench(bundle: Path, deadline_s: float, cap: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="seqrec-hardening-") as tmp:
        work = Path(tmp)
        report: dict[str, Any] = {"bench": "hardening", "bundle": bundle.name, "start_up": refused_starts(bundle, work)}
        with _serving(bundle, work, "local", request_read_timeout_s=str(deadline_s),
                      max_connections=str(cap)) as server:
            report["host_allow_list"] = foreign_hosts(server.url)
            report["slow_clients"] = slow_clients(server, deadline_s)
            report["connection_cap"] = connection_cap(server, cap, deadline_s)
            report["local_server_log_tracebacks"] = "Traceback" in server.log.read_text(errors="replace")
        report["readiness"] = readiness(bundle, work)
    report["checks"] = {name: part["ok"] for name, part in report.items() if isinstance(part, dict) and "ok" in part}
    report["checks"]["no_traceback"] = not report["local_server_log_tracebacks"]
    report["passed"] = all(report["checks"].values())
    return report


def run_hardening(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    started = Started()
    report = hardening_bench(args.artifact, args.deadline, args.cap)
    command = f"seqrec bench hardening --artifact {args.artifact} --deadline {args.deadline:g} --cap {args.cap}"
    command += f" --out {args.out}" if args.out else ""
    return print_report(report, __name__, out=args.out, **started.head(), command=command)


def add_hardening_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--artifact", type=Path, required=True, help="a bundle (served, never modified)")
    p.add_argument("--deadline", type=float, default=3.0, help="SEQREC_REQUEST_READ_TIMEOUT_S of the served bundle")
    p.add_argument("--cap", type=int, default=16, help="SEQREC_MAX_CONNECTIONS of the served bundle")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqrec bench hardening", description=__doc__.split("\n")[0])
    add_hardening_options(p)
    return run_hardening(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
