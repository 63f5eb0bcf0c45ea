"""The measuring step of `docker/smoke.sh --measure`: the api's latency through the lb, and the result file.

The smoke script has brought the stack up (docker-compose.yml plus docker/compose.local.yml) and
hands this module what it measured itself: each step's seconds (including the seconds from
`docker compose up` to the first 200 from POST /recommend), `docker stats --no-stream` of every
container and the image's size. This module offers POST /recommend through the lb at ``--rate``
for ``--duration`` seconds, then the same straight to the api (``--direct-url``, the reference
without nginx), with the open-loop client (`offline.bench.lib.load.run_load`; histories of
catalogue items from the running bundle) and writes everything, with the machine's load and core
count, to ``--out`` (docs/results/docker/smoke.json).

    docker/smoke.sh --measure       # runs this; see docs/DOCKER.md, "Measured"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.lib.load import run_load
from offline.bench.lib.payloads import payloads_from_catalogue

UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """Bytes of a `docker stats` size: "312.5MiB" -> 327680000."""
    found = re.fullmatch(r"\s*([\d.]+)\s*([KMG]i?B|B)\s*", text, flags=re.IGNORECASE)
    if found is None:
        raise SeqrecError(f"cannot read a size from {text!r}")
    return round(float(found.group(1)) * UNITS[found.group(2).lower()])


def read_times(path: Path) -> dict[str, float]:
    """The smoke's `step<TAB>seconds` lines."""
    times: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name, _, seconds = line.rpartition("\t")
        if name:
            times[name] = float(seconds)
    return times


def read_stats(path: Path, project: str) -> dict[str, dict[str, Any]]:
    """`docker stats --no-stream --format '{{.Name}}\\t{{.MemUsage}}\\t{{.CPUPerc}}'` by compose service
    (the container name less the project and the replica number: seqrec-smoke-api-2-1 -> api-2)."""
    stats: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        name, usage, cpu = line.split("\t")
        service = re.sub(r"-\d+$", "", name.removeprefix(f"{project}-"))
        used = parse_size(usage.split("/")[0])
        stats[service] = {"container": name, "mem_usage_mib": round(used / 2**20, 1), "cpu_percent": cpu}
    return stats


def machine() -> dict[str, Any]:
    """What ran the smoke, and what else was running on it (the load average over the last minute)."""
    engine = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}} {{.Driver}} {{.CgroupDriver}}"],
                            capture_output=True, text=True, check=False, timeout=30).stdout.strip()
    return {"cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2), "kernel": platform.release(),
            "engine": engine}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m offline.bench.serve.docker_smoke",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the lb, e.g. http://127.0.0.1:18080")
    parser.add_argument("--direct-url", help="the api itself (the same load, without the lb, right after)")
    parser.add_argument("--items", type=Path, required=True, help="catalogue item ids, one a line")
    parser.add_argument("--times", type=Path, required=True, help="the smoke's step<TAB>seconds file")
    parser.add_argument("--stats", type=Path, required=True, help="docker stats: name<TAB>usage<TAB>cpu")
    parser.add_argument("--project", default="seqrec-smoke", help="the compose project the containers are named by")
    parser.add_argument("--image-size", type=int, required=True, help="seqrec:cpu's size in bytes")
    parser.add_argument("--base", required=True, help="the base image the CPU image was built on")
    parser.add_argument("--pipeline-config", required=True, help="the trainer's pipeline config")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second (open loop)")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds (after 2 s of warm-up)")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    items = np.asarray([line.strip() for line in args.items.read_text().splitlines() if line.strip()])
    payloads = payloads_from_catalogue(items, 200, min_len=20, max_len=50, seed=0, k=10)
    load = run_load(args.url, payloads, args.rate, args.duration, warmup_s=2.0, label="through the lb")
    direct = None if args.direct_url is None else \
        run_load(args.direct_url, payloads, args.rate, args.duration, warmup_s=2.0, label="direct to the api")
    result = {
        "command": "docker/smoke.sh --measure",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_image": args.base,
        "pipeline_config": args.pipeline_config,
        "image": {"name": "seqrec:cpu", "size_bytes": args.image_size, "size_mib": round(args.image_size / 2**20, 1)},
        "step_seconds": read_times(args.times),
        "containers": read_stats(args.stats, args.project),
        "load": {"route": "POST /recommend through the lb (nginx), loopback",
                 "payloads": "200 histories of 20-50 catalogue items, k=10, the bundle's depth and ranker",
                 **load.to_dict()},
        "load_direct": None if direct is None else {"route": "POST /recommend to the api's own port, right after",
                                                    **direct.to_dict()},
        "machine": machine(),
        "note": args.note,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: tmp.write_text(json.dumps(result, indent=2) + "\n"))
    runs = [run for run in (load, direct) if run is not None]
    for run in runs:
        print(json.dumps({"label": run.label, "p50_ms": run.p50_ms, "p99_ms": run.p99_ms, "ok": run.ok,
                          "errors": run.errors}))
    return 0 if all(run.errors == 0 and run.ok > 0 for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
