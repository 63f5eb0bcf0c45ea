"""Retrain and roll out under steady load: 0 failed requests is the target.

    python -m offline.bench.faults.retrain_reload --artifacts /tmp/rollout --config configs/pipeline/demo.yaml \
        --rate 50 [--out docs/results/reliability/retrain-reload.json]

Publishes a first bundle with `seqrec pipeline` (unless ARTIFACTS/current exists), starts the
service on ARTIFACTS, offers it a steady open-loop load (`offline.bench.lib.load.run_load`, in windows
of WINDOW_S seconds) while `seqrec pipeline` trains and publishes a new version in a separate
process, then calls `POST /admin/reload`, and keeps the load on for --tail seconds after. Prints
the load figures (sent, ok, errors by kind, p50/p99 per window) and the model versions before and
after as a JSON report (also written to --out); exits 1 when a request failed, the reload did not
answer 200 or the version did not change.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from offline.bench.faults.reliability import Started, add_out_option, print_report
from offline.jobs.versions import CURRENT

WINDOW_S = 30.0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second during the rollout")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds of load after the reload")
    parser.add_argument("--threads", type=int, default=1, help="training threads")
    add_out_option(parser)
    return parser


def retrain_reload(url: str, pipeline: list[str], rate: float, tail_s: float, payloads: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """Load on the service at ``url`` while ``pipeline`` runs and its version is reloaded, then ``tail_s`` more."""
    from offline.bench.lib.load import get_json, post_json, run_load

    before = get_json(url, "/readyz")["model_version"]
    events: dict[str, Any] = {}
    result: dict[str, Any] = {"sent": 0, "ok": 0, "errors": 0, "error_kinds": {}, "window_s": WINDOW_S,
                              "windows": []}

    def rollout() -> None:
        time.sleep(3)
        start = time.perf_counter()
        subprocess.run(pipeline, check=True, stdout=subprocess.DEVNULL)
        events["pipeline_seconds"] = round(time.perf_counter() - start, 1)
        status, body = post_json(url, "/admin/reload", {})
        events["reload"] = {**body, "http_status": status}
        events["reload_at_s"] = round(time.perf_counter() - start + 3, 1)

    worker = threading.Thread(target=rollout)
    started = time.perf_counter()
    worker.start()
    # back-to-back open-loop windows until the rollout is over (at least one)
    while worker.is_alive() or not result["windows"]:
        r = run_load(url, payloads, rate, WINDOW_S, 0.0, seed=len(result["windows"]), label="rollout")
        for key in ("sent", "ok", "errors"):
            result[key] += getattr(r, key)
        for kind, count in r.error_kinds.items():
            result["error_kinds"][kind] = result["error_kinds"].get(kind, 0) + count
        result["windows"].append({"p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms})
    worker.join()
    tail = run_load(url, payloads, rate, tail_s, 0.0, seed=99, label="after")
    after = get_json(url, "/readyz")["model_version"]
    p99s = [w["p99_ms"] for w in result["windows"]]
    result["p99_ms_lowest_window"], result["p99_ms_highest_window"] = min(p99s), max(p99s)
    checks = {"no_failed_request": result["errors"] + tail.errors == 0,
              "reload_answered_200": events.get("reload", {}).get("http_status") == 200,
              "version_changed": before != after}
    return {"rate": rate, "load_seconds": round(time.perf_counter() - started, 1), "during": result,
            "after_reload": tail.to_dict(), "version_before": before, "version_after": after, **events,
            "checks": checks, "passed": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    started = Started()
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)

    from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
    from offline.bench.lib.processes import SERVICE_APP, start_server

    pipeline = [sys.executable, "-m", "offline.cli", "pipeline", "--config", str(args.config), "--out",
                str(args.artifacts), "--threads", str(args.threads), "-q"]
    if not (args.artifacts / CURRENT).exists():
        subprocess.run(pipeline, check=True, stdout=subprocess.DEVNULL)
    item_ids = load_catalogue(args.artifacts / CURRENT)
    payloads = payloads_from_catalogue(item_ids, 300, min_len=5, max_len=min(50, len(item_ids)), seed=0)
    env = {"SEQREC_ARTIFACTS": str(args.artifacts), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning"}
    with start_server(SERVICE_APP, env) as url:
        report = retrain_reload(url, pipeline, args.rate, args.tail, payloads)
    return print_report(report, "offline.bench.faults.retrain_reload", argv, args.out, **started.head())


if __name__ == "__main__":
    raise SystemExit(main())
