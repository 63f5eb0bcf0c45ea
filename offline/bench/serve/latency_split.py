"""Where a served request's latency goes under open-loop load, and what an idle gap costs the same work (issue 27).

    python -m offline.bench.serve.latency_split --artifact BUNDLE [--artifact ...] --out docs/results/serve/split
        [--rate 100] [--seconds 20] [--runs 2] [--requests 200]

Server side: for each bundle, the service (one uvicorn worker, one thread) is offered ``--rate`` requests/s
(Poisson arrivals, the `seqrec bench serve` bodies: histories of 50-200 random catalogue items, 200 candidates,
the ranker on) for ``--seconds`` after a 3 s warm-up, ``--runs`` times. Each answer's latency (from its due time,
as `seqrec bench serve` counts it) is split with the service's own ``timing_ms``:

- ``late``: how late the client sent it (the client shares the machine);
- ``queue``: inside the service, waiting for the model (a batch ahead of it, the hand-off to the inference
  thread and back);
- ``encode``, ``search``, ``rerank``: the two stages (`service.system.recommend.recommend_batch`);
- ``outside``: the rest: HTTP, the request's validation, the response's JSON, both event loops.

In process: the same bodies' queries at batch 1, each once right after the same call (``back_to_back``), once
after sleeping the load's mean gap between arrivals (``after_gap``) and once after spinning in Python for that
gap (``after_spin``: the core kept busy), the same work three times, alternating. On a machine whose caches (or
clock) cool between calls, the later ones cost more, and that is the cost every request of a light load pays.
Writes OUT/split.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from common.errors import SeqrecError
from offline.bench.lib.load import Call, open_loop
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import SERVICE_APP, start_server_process
from offline.cli.common import SEED, configure_logging
from offline.tables import markdown_table
from service.http.engine import set_threads
from service.system.bundle import Bundle
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch

log = logging.getLogger(__name__)
PARTS = ("latency", "late", "queue", "encode", "search", "rerank", "outside")
STAGES = ("encode", "search", "rerank")
QUANTILES = (50, 90, 99)
GAPS = ("back_to_back", "after_gap", "after_spin")  # in-process: right after the same call, after a sleep, a spin
WARMUP_S = 3.0


def split_answer(latency_ms: float, late_ms: float, timing: dict[str, float]) -> dict[str, float]:
    """One answer's latency in PARTS; ``outside`` is what the service's own timer did not see."""
    parts = {"latency": latency_ms, "late": late_ms, **{name: timing[name] for name in ("queue", *STAGES)}}
    parts["outside"] = latency_ms - late_ms - timing["total"]
    return parts


def summarise_split(rows: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Percentiles of each part, and each part's mean over the slowest 1 % (latency >= its p99)."""
    table = {part: np.array([row[part] for row in rows]) for part in PARTS}
    slow = table["latency"] >= np.percentile(table["latency"], 99)
    return {"answers": len(rows),
            "quantiles": {str(q): {p: round(float(np.percentile(v, q)), 3) for p, v in table.items()}
                          for q in QUANTILES},
            "slowest_1pct_mean": {p: round(float(v[slow].mean()), 3) for p, v in table.items()}}


def _server_runs(bundle: Path, payloads: list[dict[str, Any]], args: argparse.Namespace,
                 code: Path | None) -> list[dict[str, Any]]:
    calls = [Call("recommend", "POST", "/recommend", json.dumps(p).encode(), keep=True) for p in payloads]
    env = {"SEQREC_ARTIFACTS": str(bundle.resolve()), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning"}
    if code is not None:
        env["PYTHONPATH"] = str(code.resolve())
    runs = []
    with start_server_process(SERVICE_APP, env, cwd=code) as server:
        for n in range(args.runs):
            open_loop(server.url, lambda i: calls[i % len(calls)], args.rate, duration_s=WARMUP_S, seed=n + 100)
            run = open_loop(server.url, lambda i: calls[i % len(calls)], args.rate, duration_s=args.seconds, seed=n)
            failed = [a for a in run.answers if a.error is not None]
            if failed:
                log.warning("%s run %d: %d of %d requests failed (%s)", bundle.name, n + 1, len(failed),
                            len(run.answers), failed[0].error)
            rows = [split_answer(a.latency_ms, 1000 * (a.sent - a.due), json.loads(a.body or b"{}")["timing_ms"])
                    for a in run.answers if a.error is None]
            if not rows:
                raise SeqrecError(f"{bundle.name} run {n + 1}: no request was answered "
                                  f"({failed[0].error if failed else 'none sent'}); see the warning above")
            runs.append({**summarise_split(rows), "errors": len(failed)})
    return runs


def gap_costs(bundle: Bundle, queries: Sequence[Query], gap_s: float) -> dict[str, Any]:
    """Median stage times (ms) of each query at batch 1: right after the same call, after ``gap_s`` asleep, and
    after ``gap_s`` spinning in Python (the core kept busy, only a little memory touched)."""
    times: dict[str, dict[str, list[float]]] = {name: {} for name in GAPS}
    recommend_batch(bundle, list(queries[:4]))  # warm-up
    for q in tqdm(queries, desc="gap", unit="query", leave=False):
        for name in GAPS:
            if name == "after_gap":
                time.sleep(gap_s)
            elif name == "after_spin":
                _spin(gap_s)
            else:
                recommend_batch(bundle, [q])  # the same work just before: hot caches
            t = time.perf_counter()
            (result,) = recommend_batch(bundle, [q])
            stages = {**result.timing_ms, "total": 1000 * (time.perf_counter() - t)}
            for stage, ms in stages.items():
                times[name].setdefault(stage, []).append(ms)
    out: dict[str, Any] = {name: {s: round(float(np.median(v)), 3) for s, v in parts.items()}
                           for name, parts in times.items()}
    out["ratio"] = {s: round(out["after_gap"][s] / out["back_to_back"][s], 2) for s in out["back_to_back"]}
    out["spin_ratio"] = {s: round(out["after_spin"][s] / out["back_to_back"][s], 2) for s in out["back_to_back"]}
    out["gap_ms"] = round(1000 * gap_s, 1)
    return out


def _spin(seconds: float) -> None:
    """Keep this core busy (a Python loop, no sleep) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "runs": args.runs,
                              "requests": args.requests, "load_average_before": _loadavg(), "bundles": []}
    for path in args.artifact:
        payloads = payloads_from_catalogue(load_catalogue(path), args.requests, 50, 200, args.seed)
        server = _server_runs(path, payloads, args, args.server_code)
        set_threads(1)
        bundle = load_bundle(path)
        depth = payloads[0]["candidates"]
        queries = [Query([bundle.index_of[i] for i in p["history"]][-bundle.max_len:], k=p["k"], candidates=depth)
                   for p in payloads]
        report["bundles"].append({"bundle": path.name, "server": server, "in_process": gap_costs(
            bundle, queries, 1.0 / args.rate)})
    report["load_average_after"] = _loadavg()
    return report


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def split_markdown(report: dict[str, Any]) -> str:
    lines = ["# Where a served request's latency goes", "",
             f"Open-loop Poisson load at {report['rate']:g} r/s for {report['seconds']:g} s per run after a "
             f"{WARMUP_S:g} s warm-up, {report['runs']} run(s) per bundle, {report['requests']} bodies (histories "
             "of 50-200 random catalogue items, 200 candidates, ranker on), one uvicorn worker, one thread. "
             "`late`: the client sent late; `queue`, `encode`, `search`, `rerank`: the service's own `timing_ms`; "
             "`outside`: the rest (HTTP, validation, JSON, both event loops). Load average before "
             f"{report['load_average_before']}, after {report['load_average_after']} (2 cores; the bench's own "
             "client and server count in it).", ""]
    header = ["bundle", "run", "answers", "errors", "quantile", *PARTS]
    rows = []
    for b in report["bundles"]:
        for n, r in enumerate(b["server"], 1):
            for q in QUANTILES:
                rows.append([b["bundle"], n, r["answers"], r["errors"], f"p{q}",
                             *(r["quantiles"][str(q)][p] for p in PARTS)])
            rows.append([b["bundle"], n, r["answers"], r["errors"], "slowest 1 %, mean",
                         *(r["slowest_1pct_mean"][p] for p in PARTS)])
    lines += ["## Server, ms (each quantile taken over each part separately; they do not add up)", "",
              markdown_table(header, rows), ""]
    stages = ["encode", "search", "rerank", "total"]
    rows = [[b["bundle"], b["in_process"]["gap_ms"], *(_gap_cell(b["in_process"], s) for s in stages)]
            for b in report["bundles"]]
    lines += ["## The same queries in process, batch 1 (median ms): right after the same call / after sleeping "
              "the gap (x right after) / after spinning the gap (x right after)", "",
              markdown_table(["bundle", "gap ms", *stages], rows), ""]
    return "\n".join(lines)


def _gap_cell(costs: dict[str, Any], stage: str) -> str:
    return (f"{costs['back_to_back'][stage]} / {costs['after_gap'][stage]} ({costs['ratio'][stage]}x) / "
            f"{costs['after_spin'][stage]} ({costs['spin_ratio'][stage]}x)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, action="append", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--server-code", type=Path, default=None, help="source tree the server runs from")
    p.add_argument("--seed", type=SEED, default=0)
    args = p.parse_args(argv)
    configure_logging(logging.INFO)
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split.json").write_text(json.dumps(report, indent=2))
    text = split_markdown(report)
    (args.out / "split.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
