"""Soak: minutes of steady load at half the maximum sustained rate; latency and memory must hold.

    python -m offline.bench.soak --artifacts /tmp/rel-artifacts --minutes 10 --wait-idle 40

Serves ARTIFACTS/current (trained first with `seqrec pipeline --config CONFIG` when there is none).
Without --rate, first finds the highest rate the service sustains with p99 <= --p99-ms and no error
(`offline.bench.serve.max_sustained_rate`, --probe seconds per step up --probe-rates) and soaks at
half of it. Then offers history-carrying requests at that rate (open loop, Poisson) for --warmup
seconds plus --minutes, and reports per window of --window seconds: p50, p99, errors and the uvicorn
process's RSS (from /proc). Prints a JSON report (`offline.bench.soak_load.soak`) and exits 1 when a
target is missed: every window's p99 within 20 % of the first window's, RSS at most 10 % above the
first window's, 0 errors, no traceback in the server's log.

Other processes skew the timings on a shared machine: --wait-idle MINUTES first waits (polling
every 30 s) until no training, benchmark or test run is left (`offline.bench.soak_load.BUSY`), and the
report lists what still ran.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from offline.bench.faults import add_check, ensure_versions, log_problems, print_report, service_env
from offline.bench.serve import (
    P99_TARGET_MS,
    geometric_rates,
    load_catalogue,
    max_sustained_rate,
    payloads_from_catalogue,
    run_load,
    start_server_process,
)
from offline.bench.soak_load import busy_processes, soak, wait_until_idle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/rel-artifacts"), help="a pipeline's output")
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=None, help="requests per second (default: half the max)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of load before the first window")
    parser.add_argument("--probe", type=float, default=10.0, help="seconds per rate while finding the max")
    parser.add_argument("--probe-rates", default="10,400", help="first,last rate of the search (x1.5 steps)")
    parser.add_argument("--p99-ms", type=float, default=P99_TARGET_MS, help="the max rate's p99 target")
    parser.add_argument("--wait-idle", type=float, default=0.0, help="minutes to wait for trainings to end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="training threads, when a bundle must be trained")
    args = parser.parse_args()

    if not (args.artifacts / "current").exists():
        ensure_versions(args.artifacts, args.config, 1, args.threads)
    bundle = (args.artifacts / "current").resolve()
    waited_s, busy = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else (0.0, busy_processes())
    load_before = os.getloadavg()
    catalogue = load_catalogue(bundle)
    payloads = payloads_from_catalogue(catalogue, 300, min(5, len(catalogue)), min(50, len(catalogue)), args.seed)
    probe = None
    with start_server_process("service.app:create_app", service_env(bundle)) as server:
        run_load(server.url, payloads, 20, 3.0, 0.0)
        rate = args.rate
        if rate is None:
            first, last = (float(x) for x in args.probe_rates.split(","))
            sustained = max_sustained_rate(server.url, payloads, geometric_rates(first, last), args.probe, 2.0,
                                           args.seed, p99_ms=args.p99_ms)
            if sustained.rate is None:
                print(f"no rate from {first:g}/s up met p99 <= {args.p99_ms:g} ms without errors", file=sys.stderr)
                return 1
            rate = sustained.rate / 2
            probe = {"max_sustained_rate": sustained.rate, "p99_target_ms": args.p99_ms,
                     "steps": [{k: r.to_dict()[k] for k in ("rate", "sent", "errors", "p50_ms", "p99_ms")}
                               for r in sustained.results]}
        report = soak(server.url, server.pid, catalogue.tolist(), rate=rate, minutes=args.minutes,
                      window_s=args.window, warmup_s=args.warmup, seed=args.seed)
        add_check(report, "no_traceback_in_server_log", not log_problems(server.log))
    machine = {"cpus": os.cpu_count(), "load_avg_before": [round(x, 2) for x in load_before],
               "load_avg_after": [round(x, 2) for x in os.getloadavg()], "waited_for_idle_s": round(waited_s),
               "trainings_running_at_start": busy}
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "bundle": str(bundle),
              "machine": machine, "probe": probe, **report}
    return print_report(report)


if __name__ == "__main__":
    raise SystemExit(main())
