"""Load shedding under overload: the service with and without a queue bound, offered more than it can carry.

    python -m offline.bench.serve.shed --artifact BUNDLE --out docs/results/serve [--rates 100,200,400]
        [--queues 8,1000000] [--duration 8]

For each ``SEQREC_MAX_QUEUE`` in ``--queues`` (a large one stands for "no bound"), starts the service and
offers each rate of ``--rates`` open-loop (the `seqrec bench serve` bodies and client). Each run reports
what was answered 200, what was shed (503 with Retry-After), any other error, and the latency of the
answered requests: with a bound, the requests the server takes should keep their latency while the rest
are refused at once; without one, everything queues and latency grows with the backlog (until the client's
timeout). Writes OUT/shed.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from offline.bench.lib.load import run_load
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import SERVICE_APP, start_server_process
from offline.bench.lib.sweeps import parse_rates
from offline.cli.common import SEED
from offline.tables import markdown_table


def _shed_total(url: str) -> float:
    """seqrec_shed_total from the server's /metrics (0 when absent)."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("seqrec_shed_total"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m offline.bench.serve.shed", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="the bundle to serve")
    p.add_argument("--out", type=Path, required=True, help="folder for shed.{json,md}")
    p.add_argument("--rates", default="100,200,400", help="offered rates (requests/s), comma-separated")
    p.add_argument("--queues", default="8,1000000", help="SEQREC_MAX_QUEUE values, comma-separated")
    p.add_argument("--duration", type=float, default=8.0, help="seconds measured per rate")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds per rate before measuring")
    p.add_argument("--timeout", type=float, default=2.0, help="client timeout per request (counts as an error)")
    p.add_argument("--requests", type=int, default=2000, help="distinct request bodies")
    p.add_argument("--seed", type=SEED, default=0)
    args = p.parse_args(argv)
    rates = parse_rates(args.rates)
    queues = [int(q) for q in args.queues.split(",")]
    item_ids = load_catalogue(args.artifact)
    payloads = payloads_from_catalogue(item_ids, args.requests, 50, 200, args.seed, k=10, candidates=200,
                                       rerank=True)
    report: dict[str, Any] = {"bundle": str(args.artifact), "rates": rates, "queues": queues,
                              "duration_s": args.duration, "timeout_s": args.timeout,
                              "load_average_before": os.getloadavg(), "runs": []}
    env = {"SEQREC_ARTIFACTS": str(args.artifact), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning"}
    for queue in queues:
        with start_server_process(SERVICE_APP, {**env, "SEQREC_MAX_QUEUE": str(queue)}) as server:
            run_load(server.url, payloads, min(rates), 2.0, 0.5, args.seed)  # warm up
            for rate in rates:
                shed_before = _shed_total(server.url)
                run = run_load(server.url, payloads, rate, args.duration, args.warmup, args.seed,
                               timeout_s=args.timeout, label=f"max_queue {queue}")
                ready = httpx.get(f"{server.url}/readyz", timeout=30.0).status_code
                record = {"max_queue": queue, **run.to_dict(),
                          "shed_by_server": _shed_total(server.url) - shed_before, "readyz_after": ready}
                report["runs"].append(record)
                print(f"max_queue {queue} at {rate:g} r/s: {run.ok} ok, errors {run.error_kinds}, "
                      f"p99 {run.p99_ms} ms", file=sys.stderr)
    report["load_average_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shed.json").write_text(json.dumps(report, indent=2))
    text = shed_markdown(report)
    (args.out / "shed.md").write_text(text)
    print(text)
    return 0


def shed_markdown(report: dict[str, Any]) -> str:
    head = ["SEQREC_MAX_QUEUE", "offered r/s", "sent", "answered 200", "shed (503)", "other errors",
            "answered r/s", "p50 ms (200s)", "p99 ms (200s)", "max ms (200s)", "/readyz after"]
    rows = []
    for r in report["runs"]:
        shed = r["error_kinds"].get("HTTP 503", 0)
        other = {k: v for k, v in r["error_kinds"].items() if k != "HTTP 503"}
        rows.append([r["max_queue"], r["rate"], r["sent"], r["ok"], shed,
                     ", ".join(f"{k}: {v}" for k, v in other.items()) or "0", round(r["throughput"], 1),
                     r["p50_ms"], r["p99_ms"], r["max_ms"], r["readyz_after"]])
    load = (f"Load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in report['load_average_before'])} before, "
            f"{', '.join(f'{x:.1f}' for x in report['load_average_after'])} after.")
    return "\n".join([
        "# Load shedding under overload", "",
        f"Bundle {report['bundle']}; 1 worker, 1 thread; open-loop Poisson arrivals, {report['duration_s']:g} s "
        f"measured per rate; histories of 50-200 items, k=10, 200 candidates; client timeout "
        f"{report['timeout_s']:g} s (a timeout counts as an error). Latencies are those of the 200 answers, "
        "from each request's due time.", "", load, "", markdown_table(head, rows), ""])


if __name__ == "__main__":
    raise SystemExit(main())
