"""Publish broken bundles under steady load: each is refused with its reason, the old model keeps serving.

    python -m offline.bench.bad_push --artifacts /tmp/rel-artifacts --rate 50

Takes the two newest versions of ARTIFACTS (a pipeline's output; `seqrec pipeline --config CONFIG`
trains what is missing) as v1 and v2, and serves v1 from a temporary artifacts folder whose
`current` it switches. Under an open-loop Poisson load of history-carrying requests it publishes,
one after the other, a truncated bundle (retriever.pt cut in half), a checksum-mismatched one (a
byte of items.faiss flipped), a shape-mismatched one (d_model doubled in config.json, checksum
rewritten) and an incomplete one (items.faiss missing): each time `current` is switched to it,
POST /admin/reload must answer 409 with the reason, and `current` is switched back. Then v2 is
published the same way and must answer 200. Prints a JSON report (`offline.bench.faults.bad_push`)
and exits 1 when a target is missed: every broken bundle refused with its reason, every request
answered 2xx, by v1 until the good push and by v2 after it, no traceback in the server's log.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from offline.bench.faults import (
    BREAKS,
    add_check,
    bad_push,
    broken_copy,
    ensure_versions,
    log_problems,
    print_report,
    service_env,
)
from offline.bench.serve import load_catalogue, payloads_from_catalogue, run_load, start_server_process
from offline.jobs.pipeline import switch_current


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/rel-artifacts"), help="a pipeline's output")
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds of load before the first push")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds of load between pushes")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds of load after the good push")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="training threads, when versions must be trained")
    args = parser.parse_args()

    v1, v2 = ensure_versions(args.artifacts, args.config, 2, args.threads)[-2:]
    catalogue = load_catalogue(v1)
    with tempfile.TemporaryDirectory(prefix="seqrec-bad-push-") as tmp:
        root = Path(tmp)
        broken = {kind: (root / kind, broken_copy(v1, root / kind, kind)) for kind in BREAKS}
        switch_current(root, v1)
        with start_server_process("service.app:create_app", service_env(root)) as server:
            warmup = payloads_from_catalogue(catalogue, 50, min(5, len(catalogue)), min(50, len(catalogue)))
            run_load(server.url, warmup, min(args.rate, 50), 3.0, 0.0)
            report = bad_push(server.url, root, v1, broken, v2, catalogue.tolist(), rate=args.rate,
                              lead_s=args.lead, gap_s=args.gap, tail_s=args.tail, seed=args.seed)
            add_check(report, "no_traceback_in_server_log", not log_problems(server.log))
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "v1": str(v1), "v2": str(v2), **report}
    return print_report(report)


if __name__ == "__main__":
    raise SystemExit(main())
