"""Kill Redis under steady mixed load and restart it: nothing acknowledged may be lost.

    python -m offline.bench.redis_faults --artifacts /tmp/rel-artifacts --rate 60 --before 20 --down 10 --after 20

Serves ARTIFACTS/current (trained first with `seqrec pipeline --config CONFIG` when there is none)
with SEQREC_REDIS_URL pointing at a redis-server of this script's own on a free port (no RDB
snapshots; an append-only file in a temporary folder, fsynced on every write). Offers an open-loop
Poisson load mixing requests that carry their history, user_id-only requests and POST /events (a
unique item per event), kills Redis with SIGKILL --before seconds in, keeps it down --down seconds,
restarts it on the same port and keeps the load on --after seconds more. Prints a JSON report
(`offline.bench.faults.redis_faults`) and exits 1 when a target is missed: history-carrying requests
never fail; user_id-only requests and events get 503 during the outage and 2xx before and after it;
every event acknowledged with 2xx is in Redis afterwards; no traceback in the server's log.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from offline.bench.faults import (
    RedisProcess,
    add_check,
    ensure_versions,
    log_problems,
    print_report,
    redis_faults,
    service_env,
)
from offline.bench.serve import free_port, load_catalogue, payloads_from_catalogue, run_load, start_server_process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/rel-artifacts"), help="a pipeline's output")
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second, all kinds together")
    parser.add_argument("--before", type=float, default=20.0, help="seconds of load before the kill")
    parser.add_argument("--down", type=float, default=10.0, help="seconds Redis stays down")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the restart")
    parser.add_argument("--mix", default="0.5,0.25,0.25", help="shares of history, user_id-only and event requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="training threads, when a bundle must be trained")
    args = parser.parse_args()
    shares = tuple(float(x) for x in args.mix.split(","))
    if len(shares) != 3 or min(shares) < 0 or sum(shares) <= 0:
        parser.error(f"--mix {args.mix!r}: three non-negative shares")

    if not (args.artifacts / "current").exists():
        ensure_versions(args.artifacts, args.config, 1, args.threads)
    bundle = (args.artifacts / "current").resolve()
    catalogue = load_catalogue(bundle)
    with tempfile.TemporaryDirectory(prefix="seqrec-redis-faults-") as tmp:
        redis = RedisProcess(free_port(), Path(tmp) / "redis")
        with redis, start_server_process("service.app:create_app",
                                         service_env(bundle, redis_url=redis.url)) as server:
            warmup = payloads_from_catalogue(catalogue, 50, min(5, len(catalogue)), min(50, len(catalogue)))
            run_load(server.url, warmup, min(args.rate, 50), 3.0, 0.0)
            report = redis_faults(server.url, redis, catalogue.tolist(), rate=args.rate, before_s=args.before,
                                  down_s=args.down, after_s=args.after, seed=args.seed,
                                  shares=(shares[0], shares[1], shares[2]))
            add_check(report, "no_traceback_in_server_log", not log_problems(server.log))
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "bundle": str(bundle), **report}
    return print_report(report)


if __name__ == "__main__":
    raise SystemExit(main())
