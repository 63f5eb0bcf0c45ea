"""Retrain and roll out under steady load: 0 failed requests is the target.

    python -m offline.bench.retrain_reload --artifacts /tmp/rollout --config configs/pipeline/demo.yaml --rate 50

Publishes a first bundle with `seqrec pipeline` (unless ARTIFACTS/current exists), starts the
service on ARTIFACTS, offers it a steady open-loop load (`offline.bench.load.run_load`) while
`seqrec pipeline` trains and publishes a new version in a separate process, then calls
`POST /admin/reload`, and keeps the load on for --tail seconds after. Prints the load figures
(sent, ok, errors by kind, p50/p99) and the model versions before and after, as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from offline.jobs.versions import CURRENT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second during the rollout")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds of load after the reload")
    parser.add_argument("--threads", type=int, default=1, help="training threads")
    args = parser.parse_args()

    from offline.bench.load import get_json, post_json, run_load
    from offline.bench.payloads import load_catalogue, payloads_from_catalogue
    from offline.bench.processes import SERVICE_APP, start_server

    seqrec = [sys.executable, "-m", "offline.cli"]
    pipeline = [*seqrec, "pipeline", "--config", str(args.config), "--out", str(args.artifacts),
                "--threads", str(args.threads), "-q"]
    if not (args.artifacts / CURRENT).exists():
        subprocess.run(pipeline, check=True, stdout=subprocess.DEVNULL)
    item_ids = load_catalogue(args.artifacts / CURRENT)
    payloads = payloads_from_catalogue(item_ids, 300, min_len=5, max_len=min(50, len(item_ids)), seed=0)
    env = {"SEQREC_ARTIFACTS": str(args.artifacts), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning"}
    with start_server(SERVICE_APP, env) as url:
        before = get_json(url, "/readyz")["model_version"]
        events: dict[str, Any] = {}
        result: dict[str, Any] = {}

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
        # one long open-loop run covering the pipeline and --tail seconds after it (estimated from a first pass)
        while worker.is_alive() or not result:
            window = 30.0
            r = run_load(url, payloads, args.rate, window, 0.0, seed=len(result), label="rollout")
            for key in ("sent", "ok", "errors"):
                result[key] = result.get(key, 0) + getattr(r, key)
            for kind, count in r.error_kinds.items():
                result.setdefault("error_kinds", {})[kind] = result.get("error_kinds", {}).get(kind, 0) + count
            result.setdefault("windows", []).append({"p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms})
        worker.join()
        tail = run_load(url, payloads, args.rate, args.tail, 0.0, seed=99, label="after")
        after = get_json(url, "/readyz")["model_version"]
    report = {"rate": args.rate, "load_seconds": round(time.perf_counter() - started, 1), "during": result,
              "after_reload": tail.to_dict(), "version_before": before, "version_after": after, **events}
    print(json.dumps(report, indent=2))
    failed = result["errors"] + tail.errors
    return 0 if failed == 0 and events.get("reload", {}).get("http_status") == 200 and before != after else 1


if __name__ == "__main__":
    raise SystemExit(main())
