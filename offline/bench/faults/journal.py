"""Catalogue changes against the journal's size, and through ``kill -9``: the append-only journal's two promises.

    seqrec bench journal --artifact BUNDLE [--sizes 10,100000] [--changes 30] [--out docs/results/store/journal.json]

For each size N, a copy of BUNDLE gets a journal of N pending items (written as the service writes them: the items
are known to no model, so no vector is made), a real server (uvicorn, one worker) serves it, and ``--changes`` adds
of one new item (``POST /admin/items``) and as many retirements (``DELETE /admin/items/{id}``) are timed over HTTP,
one after the other. Then the kill: a client sends adds and retirements one after the other while the server is
killed with SIGKILL at a random moment; the server is started again on the same journal, and every acknowledged
change (answered 200) must be in it, and nothing but those and the one in flight. Prints a JSON report; exits 1
unless each kind's median at the largest size stays within 3 x the smallest's and no acknowledged change is lost.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from offline.bench.faults.reliability import print_report
from offline.bench.lib.processes import SERVICE_APP, UvicornProcess
from service.system.catalog import read_journal
from service.system.journal import journal_file, write_records

KEY = "journal-bench-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _server(bundle: Path, log: Path) -> UvicornProcess:
    env = {"SEQREC_ARTIFACTS": str(bundle), "SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1", "SEQREC_API_KEY": KEY,
           "SEQREC_LOG_LEVEL": "warning"}
    return UvicornProcess(SERVICE_APP, {**os.environ, **env}, log).launch().wait_ready(300)


def _quantiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"median": round(statistics.median(ordered), 2), "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


def timed_changes(bundle: Path, workdir: Path, size: int, changes: int) -> dict[str, Any]:
    copy = Path(shutil.copytree(bundle, workdir / f"bundle-{size}"))
    write_records(copy, [{"added": [{"item_id": f"pending-{k}"} for k in range(size)]}])
    server = _server(copy, workdir / f"server-{size}.log")
    adds, retires = [], []
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
            for k in range(changes):
                start = time.perf_counter()
                r = client.post("/admin/items", json={"items": [{"item_id": f"new-{k}"}]})
                adds.append((time.perf_counter() - start) * 1000)
                if r.status_code != 200 or r.json()["pending"] != size + k + 1:
                    raise RuntimeError(f"add {k} at {size}: {r.status_code} {r.text[:200]}")
            for k in range(changes):
                start = time.perf_counter()
                r = client.delete(f"/admin/items/new-{k}")
                retires.append((time.perf_counter() - start) * 1000)
                if r.status_code != 200 or r.json()["already"]:
                    raise RuntimeError(f"retire {k} at {size}: {r.status_code} {r.text[:200]}")
    finally:
        server.stop()
    return {"pending_items": size, "journal_bytes": journal_file(copy).stat().st_size,
            "add_ms": _quantiles(adds), "retire_ms": _quantiles(retires)}


def kill_during_changes(bundle: Path, workdir: Path, seed: int = 0, kill_after_s: float = 3.0) -> dict[str, Any]:
    """Changes one after the other, the server SIGKILLed after ``kill_after_s`` +- 50 %: the restarted server's
    journal holds every acknowledged change, and beyond them at most the one in flight."""
    copy = Path(shutil.copytree(bundle, workdir / "bundle-kill"))
    server = _server(copy, workdir / "server-kill.log")
    acked: list[tuple[str, str]] = []
    in_flight: list[tuple[str, str]] = []
    stop = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
            k = 0
            while not stop.is_set():
                change = ("add", f"k{k}") if k % 3 != 2 else ("retire", f"k{k - 1}")
                in_flight[:] = [change]
                try:
                    r = (client.post("/admin/items", json={"items": [{"item_id": change[1]}]}) if change[0] == "add"
                         else client.delete(f"/admin/items/{change[1]}"))
                except httpx.TransportError:
                    return
                if r.status_code == 200:
                    acked.append(change)
                k += 1

    client_thread = threading.Thread(target=stream)
    client_thread.start()
    time.sleep(kill_after_s * random.Random(seed).uniform(0.5, 1.5))
    assert server.proc is not None
    server.proc.kill()  # SIGKILL: no shutdown, no flush
    server.proc.wait()
    stop.set()
    client_thread.join()
    restarted = _server(copy, workdir / "server-kill-2.log")
    try:
        with httpx.Client(base_url=restarted.url, headers=AUTH, timeout=30) as client:
            again = [client.post("/admin/items", json={"items": [{"item_id": i}]}).status_code
                     for kind, i in acked if kind == "add"]
    finally:
        restarted.stop()
    journal = read_journal(copy)
    added, retired = set(journal.added_ids), set(journal.retired)
    want_added = {i for kind, i in acked if kind == "add"}
    want_retired = {i for kind, i in acked if kind == "retire"}
    extra = (added - want_added) | (retired - want_retired)
    lost = (want_added - added) | (want_retired - retired)
    return {"acknowledged": len(acked), "lost": sorted(lost), "unacknowledged_kept": sorted(extra),
            "in_flight": in_flight, "refused_again_409": sum(s == 409 for s in again),
            "ok": not lost and extra <= {i for _, i in in_flight} and all(s == 409 for s in again)}


def journal_bench(bundle: Path, sizes: tuple[int, ...], changes: int, seed: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="seqrec-journal-") as tmp:
        rows = [timed_changes(bundle, Path(tmp), size, changes) for size in sizes]
        kill = kill_during_changes(bundle, Path(tmp), seed)
    ratios = {kind: round(rows[-1][f"{kind}_ms"]["median"] / rows[0][f"{kind}_ms"]["median"], 2)
              for kind in ("add", "retire")}
    flat = all(r <= 3.0 for r in ratios.values())
    return {"bench": "journal", "bundle": bundle.name, "rows": rows, "median_ratio_largest_to_smallest": ratios,
            "kill_9": kill, "flat": flat, "passed": flat and kill["ok"]}


def run_journal(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    sizes = tuple(int(s) for s in str(args.sizes).split(","))
    report = journal_bench(args.artifact, sizes, args.changes)
    command = f"seqrec bench journal --artifact {args.artifact} --sizes {args.sizes} --changes {args.changes}"
    command += f" --out {args.out}" if args.out else ""
    return print_report(report, __name__, out=args.out, command=command)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqrec bench journal", description=__doc__.split("\n")[0])
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--sizes", default="10,100000")
    p.add_argument("--changes", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    return run_journal(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
