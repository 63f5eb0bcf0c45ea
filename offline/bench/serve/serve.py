"""`seqrec bench serve`: open-loop HTTP load against a real service process, and its framework ceiling.

The server runs as its own uvicorn process (`offline.bench.lib.processes`); the load client
(`offline.bench.lib.load`) runs in this one, and `offline.bench.lib.sweeps` steps the offered rate up
until the service misses p99 <= 50 ms or answers an error.

``service.http.noop.noop_app`` is a FastAPI app that parses the same request body and answers a constant: the same
client against it gives the ceiling this framework, server and machine reach with no model work.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from offline.bench.lib.load import LoadResult, post_json, run_load
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import (
    SERVICE_APP,
    process_cpu_seconds,
    start_server_process,
    tree_cpu_seconds,
    tree_memory_bytes,
    worker_shares,
)
from offline.bench.lib.sweeps import max_sustained_rate, parse_rates, report_table
from offline.bench.serve.serve_check import check_answers
from offline.tables import markdown_table

NOOP_APP = "service.http.noop:noop_app"


def _measure(args: argparse.Namespace, rates: Sequence[float], label: str, app: str, env: dict[str, str],
             payloads: list[dict[str, Any]], runs: list[LoadResult],
             answers: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """One server: a short warm-up, its CPU time per request at --cpu-rate, the p99 at --check-rate, the rates
    stepped up until one fails, then ``answers(url)`` (the served answers checked against the reference path)."""
    options = {"arrivals": args.arrivals, "timeout_s": args.timeout, "label": label}
    code = args.server_code
    if code is not None:  # another version's source tree: the servers import it (cwd first on sys.path)
        env = {**env, "PYTHONPATH": str(code.resolve())}
    with start_server_process(app, env, workers=args.workers, cwd=code) as server:
        url = server.url
        run_load(url, payloads, min(rates), 2.0, 0.5, args.seed, **options)  # warm the server (every worker) up
        cpu = tree_cpu_seconds(server.pid)  # first, at a rate both apps keep up with: no backlog counts in
        light = run_load(url, payloads, args.cpu_rate, args.duration, 0.0, args.seed, **options)
        cpu_ms = 1000 * (tree_cpu_seconds(server.pid) - cpu) / max(light.ok, 1)
        before = process_cpu_seconds(server.pid)
        check = run_load(url, payloads, args.check_rate, args.duration, args.warmup, args.seed, **options)
        shares = worker_shares(before, process_cpu_seconds(server.pid), server.pid)
        with contextlib.suppress(OSError):  # queued behind any backlog the check left: the sweep starts idle
            post_json(url, "/recommend", payloads[0])
        sustained = max_sustained_rate(url, payloads, rates, args.duration, args.warmup, args.seed, **options)
        checked = None if answers is None else answers(url)
        memory = {k: round(v / 2**20, 1) for k, v in tree_memory_bytes(server.pid).items()}
    runs.extend([light, check, *sustained.results])
    out = {"check": check.to_dict(), "cpu_ms_per_request": round(cpu_ms, 3), "cpu_run": light.to_dict(),
           "worker_shares": shares,
           "memory_mb": memory,
           "max_rate_p99_50ms": sustained.rate,
           "sweep": [r.to_dict() for r in sustained.results]}
    return out if checked is None else {**out, "answers": checked}


def run_serve_bench(args: argparse.Namespace) -> int:
    """Sweep the same offered rates against the no-op app and against each bundle's service; write
    OUT/serve.{json,md}: the p99 at ``--check-rate`` and the highest rate held with p99 <= 50 ms."""
    rates = parse_rates(args.rates)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "handler"}
    report: dict[str, Any] = {"settings": json.loads(json.dumps(settings, default=str)), "targets": {},
                              "load_average_before": os.getloadavg(), "cores": os.cpu_count()}
    runs: list[LoadResult] = []
    env = {"SEQREC_THREADS": str(args.threads), "SEQREC_MAX_BATCH": str(args.max_batch),
           "SEQREC_MAX_WAIT_MS": str(args.max_wait_ms), "SEQREC_LOG_LEVEL": "warning"}
    if args.concurrency is not None:
        env["SEQREC_CONCURRENCY"] = str(args.concurrency)
    for bundle in args.artifact:
        item_ids = load_catalogue(bundle)
        payloads = payloads_from_catalogue(item_ids, args.requests, args.min_len, args.max_len, args.seed,
                                           k=args.k, candidates=args.candidates, rerank=not args.no_rerank)
        if args.personalize:
            for payload in payloads:
                payload["personalize"] = True
        name = Path(bundle).name
        noop = _measure(args, rates, f"no-op ({name} bodies)", NOOP_APP, env, payloads, runs)
        service = _measure(args, rates, name, SERVICE_APP, {**env, "SEQREC_ARTIFACTS": str(bundle)}, payloads, runs,
                           functools.partial(check_answers, bundle_path=Path(bundle),
                                             bodies=payloads[: args.check_answers]))
        ratio = (service["max_rate_p99_50ms"] / noop["max_rate_p99_50ms"]
                 if service["max_rate_p99_50ms"] and noop["max_rate_p99_50ms"] else None)
        cpu_ratio = noop["cpu_ms_per_request"] / max(service["cpu_ms_per_request"], 1e-9)
        report["targets"][name] = {"bundle": str(bundle), "catalogue": len(item_ids), "noop": noop,
                                   "service": service, "ratio_to_noop": ratio, "cpu_ratio_to_noop": cpu_ratio}
    report["load_average_after"] = os.getloadavg()  # what else ran on the machine meanwhile
    (args.out / "serve.json").write_text(json.dumps(report, indent=2))
    text = serve_markdown(report, runs)
    (args.out / "serve.md").write_text(text)
    print(text)
    failed = [name for name, t in report["targets"].items() if not t["service"]["answers"]["passed"]]
    if failed:
        print(f"served answers differ from the reference path for {', '.join(failed)}")
    return 1 if failed else 0


def serve_markdown(report: dict[str, Any], runs: Sequence[LoadResult]) -> str:
    """serve.md: one row per bundle, then every run."""
    s = report["settings"]
    rerank = not s["no_rerank"]
    rows = []
    for name, t in report["targets"].items():
        check = t["service"]["check"]
        ratio = "" if t["ratio_to_noop"] is None else f"{t['ratio_to_noop']:.3f}"
        a = t["service"].get("answers")
        answers = "" if a is None else (f"{a['identical_topk']}/{a['checked']} identical, max score diff "
                                        f"{a['max_score_diff']:.1e}: {'pass' if a['passed'] else 'FAIL'}")
        rows.append([name, t["catalogue"], f"{check['p99_ms']} at {s['check_rate']:g} r/s", check["errors"],
                     t["service"]["max_rate_p99_50ms"], t["noop"]["max_rate_p99_50ms"], ratio,
                     t["service"]["cpu_ms_per_request"], t["noop"]["cpu_ms_per_request"],
                     f"{t['cpu_ratio_to_noop']:.3f}", t["service"]["memory_mb"]["pss"],
                     _shares(t["service"]), _shares(t["noop"]), answers])
    head = ["bundle", "items", "p99 at check rate (ms)", "errors", "max rate, p99 <= 50 ms", "no-op max rate",
            "ratio", "server CPU ms/request", "no-op CPU ms/request", "CPU ratio", "server PSS MB",
            "workers' CPU shares at check rate", "no-op workers' shares", "answers vs reference path"]
    load = (f"Load average (1, 5, 15 min) of the {report['cores']}-core machine: "
            f"{', '.join(f'{x:.1f}' for x in report['load_average_before'])} before, "
            f"{', '.join(f'{x:.1f}' for x in report['load_average_after'])} after (the bench's own client and "
            f"servers count in it; more than about 2 means other jobs shared the cores). "
            f"Server CPU ms/request: the server's CPU time (all its processes) per answered request over a run at "
            f"{s['cpu_rate']:g} r/s; CPU ratio = no-op's / seqrec's, the throughput ratio an otherwise idle machine "
            "would allow.")
    lines = ["# seqrec bench serve", "",
             f"Open-loop {s['arrivals']} arrivals, {s['duration']:g} s per rate after {s['warmup']:g} s warm-up; "
             f"histories of {s['min_len']}-{s['max_len']} random catalogue items, k={s['k']}, "
             f"candidates={s['candidates']}, rerank={rerank}, personalize={s['personalize']}; "
             f"server (both apps): {s['workers']} uvicorn worker(s), {s['threads']} torch thread(s), "
             f"{s.get('concurrency') or 'default'} concurrent batch(es) (SEQREC_CONCURRENCY), max batch "
             f"{s['max_batch']}, max wait {s['max_wait_ms']:g} ms.", "", load, "", markdown_table(head, rows), "",
             "## Every run", "", report_table(runs)]
    return "\n".join(lines)


def _shares(target: dict[str, Any]) -> str:
    """The workers' CPU shares over the check run ("-" in a file from before they were measured)."""
    shares = target.get("worker_shares")
    return "-" if shares is None else " / ".join(f"{x:.2f}" for x in shares)
