"""How long Python's cyclic garbage collector stops the server: this version against another, side by side.

    python -m offline.bench.serve.gc_pauses --artifact BUNDLE --out docs/results/serve/gc-freeze \
        [--server-code OLD_TREE] [--rate 100] [--seconds 20] [--runs 2]

Starts the service with a ``sitecustomize`` module first on its path (`HOOK`) that times every collection
with ``gc.callbacks`` and prints each as a JSON line to the server's output, so any version of the service
can be probed unchanged. With ``--server-code`` (a source tree of another version, e.g. a ``git worktree`` of
the commit before `service.http.engine.settle_heap`), its runs ("before") alternate with this version's
("this"), ``--runs`` of each. Each run warms up at 10 r/s for 3 s, then offers ``--rate`` requests/s
open-loop for ``--seconds``; the collections counted are those inside that window.
Writes OUT/gc-pauses.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from offline.bench.lib.load import run_load
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import SERVICE_APP, start_server_process
from offline.tables import markdown_table

MARK = '{"gc_pause"'
HOOK = """\
import gc, json, sys, time

_started = []


def _timed(phase, info):
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        ms = 1000 * (time.perf_counter() - _started[0])
        print(json.dumps({"gc_pause": info["generation"], "ms": round(ms, 3), "collected": info["collected"],
                          "t": time.time()}), file=sys.stderr, flush=True)


gc.callbacks.append(_timed)
"""


def pauses(log_text: str, start: float, end: float) -> list[dict[str, Any]]:
    """The collections the probe printed between wall times ``start`` and ``end``."""
    found = [json.loads(line) for line in log_text.splitlines() if line.startswith(MARK)]
    return [p for p in found if start <= p["t"] <= end]


def one_run(bundle: Path, version: str, code: Path | None, rate: float, seconds: float,
            payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One server of ``code`` (None: this version) under load; its collections inside the measured window."""
    with tempfile.TemporaryDirectory(prefix="seqrec-gc-hook-") as hook:
        (Path(hook) / "sitecustomize.py").write_text(HOOK)
        path = [hook, *([str(code.resolve())] if code is not None else []), os.environ.get("PYTHONPATH", "")]
        env = {"SEQREC_ARTIFACTS": str(bundle.resolve()), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning",
               "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        with start_server_process(SERVICE_APP, env, cwd=code) as server:
            run_load(server.url, payloads, 10.0, 3.0, 0.5, label="warm-up")
            start = time.time()
            load = run_load(server.url, payloads, rate, seconds, 0.0, label=version)
            found = pauses(server.log.read_text(), start, time.time())
    full = [p["ms"] for p in found if p["gc_pause"] == 2]
    young = [p["ms"] for p in found if p["gc_pause"] < 2]
    return {"version": version, "bundle": bundle.name, "rate": rate, "seconds": seconds, "ok": load.ok,
            "errors": load.errors, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms, "max_ms": load.max_ms,
            "full_collections": len(full), "full_ms_max": max(full, default=0.0), "full_ms_total": round(sum(full), 1),
            "young_collections": len(young), "young_ms_max": max(young, default=0.0),
            "young_ms_total": round(sum(young), 1)}


COLUMNS = ("bundle", "version", "ok", "errors", "p50_ms", "p99_ms", "max_ms", "full_collections", "full_ms_max",
           "full_ms_total", "young_collections", "young_ms_max", "young_ms_total")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, action="append", required=True, help="bundle (repeatable)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--server-code", type=Path, default=None, help="source tree of the version to compare with")
    p.add_argument("--runs", type=int, default=2, help="runs of each version, alternating")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    runs = []
    for bundle in args.artifact:
        payloads = payloads_from_catalogue(load_catalogue(bundle), 200, 50, 200, 0)
        versions = [("this", None)] if args.server_code is None else [("before", args.server_code), ("this", None)]
        for _ in range(args.runs):
            for version, code in versions:
                runs.append(one_run(bundle, version, code, args.rate, args.seconds, payloads))
                print(json.dumps(runs[-1]), flush=True)
    load_after = os.getloadavg()
    command = shlex.join(["python", "-m", "offline.bench.serve.gc_pauses", *argv])
    report = {"command": command, "cores": os.cpu_count(), "load_average_before": load_before,
              "load_average_after": load_after, "runs": runs}
    (args.out / "gc-pauses.json").write_text(json.dumps(report, indent=2))
    text = "\n".join([
        "# Garbage-collector pauses in the server", "", f"`{command}`", "",
        f"{args.rate:g} r/s open-loop for {args.seconds:g} s per run (histories of 50-200 items, k=10, 200 "
        "candidates, 1 worker, 1 thread); collections timed by `gc.callbacks` in the server (a `sitecustomize` hook); "
        "this = this version, before = the `--server-code` tree. full = the oldest "
        "generation's collections (they walk every object the collector tracks), young = generations 0 and 1. "
        f"Load average before {', '.join(f'{x:.1f}' for x in load_before)}, after "
        f"{', '.join(f'{x:.1f}' for x in load_after)} (this bench's own client and server count "
        "in it).", "",
        markdown_table(list(COLUMNS), [[r[c] for c in COLUMNS] for r in runs]), ""])
    (args.out / "gc-pauses.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
