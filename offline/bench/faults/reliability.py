"""What the reliability scenarios share: their requests, the bundles they serve, and the script plumbing.

`offline.bench.faults.redis_faults`, `offline.bench.faults.bad_push` and `offline.bench.faults.soak` each hold one
scenario (a function `tests/service/test_faults.py` runs in small) and the script that runs it at
full length: train what is missing with `seqrec pipeline`, serve it, warm it up, run the scenario,
check the server's log for tracebacks, print a JSON report and exit 1 when a target was missed.
With --out FILE the report is also written to FILE (atomically), as the files under
docs/results/reliability/ are; `offline.bench.faults.training_faults` and `offline.bench.faults.retrain_reload`
report the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import write_json
from common.errors import SeqrecError
from offline.bench.lib.load import Call, run_load
from offline.bench.lib.payloads import short_payloads
from offline.bench.lib.processes import SERVICE_APP, RunningServer, start_server_process
from offline.cli.common import SEED
from offline.jobs.versions import CURRENT, VERSIONS


def history_calls(catalogue: Sequence[str], seed: int, keep: bool = False) -> list[Call]:
    """POST /recommend bodies with 5-50 random catalogue items each."""
    payloads = short_payloads(np.asarray(catalogue), 200, seed)
    return [Call("history", "POST", "/recommend", json.dumps(p).encode(), keep=keep) for p in payloads]


# --------------------------------------------------------------------------- bundles for the scripts


def published_versions(artifacts: Path) -> list[Path]:
    """ARTIFACTS/versions/* holding a manifest, oldest first (by the manifest's created_at)."""
    folder = artifacts / VERSIONS
    found = [p for p in folder.iterdir() if (p / "manifest.json").is_file()] if folder.is_dir() else []
    return sorted(found, key=lambda p: (json.loads((p / "manifest.json").read_text()).get("created_at", ""), p.name))


def ensure_versions(artifacts: Path, config: Path, n: int, threads: int = 1) -> list[Path]:
    """At least ``n`` published versions in ARTIFACTS: `seqrec pipeline --config CONFIG` runs until there are."""
    while len(versions := published_versions(artifacts)) < n:
        command = [sys.executable, "-m", "offline.cli", "pipeline", "--config", str(config), "--out", str(artifacts),
                   "--threads", str(threads), "-q"]
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            raise SeqrecError(f"`{' '.join(command)}` failed")
    return versions


def current_bundle(args: argparse.Namespace) -> Path:
    """ARTIFACTS/current, resolved; trained first with `seqrec pipeline --config CONFIG` when there is none."""
    if not (args.artifacts / CURRENT).exists():
        ensure_versions(args.artifacts, args.config, 1, args.threads)
    return (args.artifacts / CURRENT).resolve()


def service_env(artifacts: Path, **settings: str) -> dict[str, str]:
    """SEQREC_* variables of a one-thread service on ``artifacts``."""
    return {"SEQREC_ARTIFACTS": str(artifacts), "SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1",
            "SEQREC_LOG_LEVEL": "warning", **{f"SEQREC_{k.upper()}": v for k, v in settings.items()}}


# --------------------------------------------------------------------------- the scripts' plumbing


def scenario_parser(doc: str | None, threads_help: str = "training threads, when a bundle must be trained"
                    ) -> argparse.ArgumentParser:
    """The options every scenario script takes: the artifacts it serves, the pipeline that trains them, a seed."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/rel-artifacts"), help="a pipeline's output")
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--threads", type=int, default=1, help=threads_help)
    add_out_option(parser)
    return parser


def add_out_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the JSON report to this file (atomically), with the command that made it")


@contextlib.contextmanager
def warmed_service(env: Mapping[str, str], catalogue: np.ndarray, rate: float, n_payloads: int = 50
                   ) -> Iterator[RunningServer]:
    """The service in its own uvicorn process, offered three seconds of load before the scenario starts."""
    with start_server_process(SERVICE_APP, env) as server:
        run_load(server.url, short_payloads(catalogue, n_payloads), rate, 3.0, 0.0)
        yield server


def log_problems(log: Path) -> list[str]:
    """Tracebacks in a server's output."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [text[-5000:]] if "Traceback" in text or "Exception in ASGI application" in text else []


def add_check(report: dict[str, Any], name: str, ok: bool) -> None:
    report["checks"][name] = ok
    report["passed"] = all(report["checks"].values())


def check_log(report: dict[str, Any], server: RunningServer) -> None:
    """The last check of every scenario: no traceback in the server's output."""
    add_check(report, "no_traceback_in_server_log", not log_problems(server.log))


@dataclass(frozen=True)
class Started:
    """When a script began and the machine's load then: what its report says about the run."""

    at: float = field(default_factory=time.perf_counter)
    load_avg: tuple[float, float, float] = field(default_factory=os.getloadavg)

    def head(self) -> dict[str, Any]:
        """The run's wall time and the machine: its cores and the load averages (1, 5, 15 min) before and after."""
        return {"seconds": round(time.perf_counter() - self.at, 1),
                "machine": {"cpus": os.cpu_count(), "load_avg_before": [round(x, 2) for x in self.load_avg],
                            "load_avg_after": [round(x, 2) for x in os.getloadavg()]}}


def recorded_command(module: str, argv: Sequence[str]) -> str:
    """`python -m MODULE ARGS`, quoted so that it parses again (a --note with spaces stays one argument)."""
    return shlex.join(["python", "-m", module, *argv])


def print_report(report: Mapping[str, Any], module: str, argv: Sequence[str] | None = None, out: Path | None = None,
                 **head: Any) -> int:
    """The report (after ``head``: the command line, when it ended and what it ran on) as JSON on stdout, and in
    ``out`` when given (a failed run's report too); 0 when it passed. ``argv``: the script's arguments
    (default sys.argv[1:])."""
    command = recorded_command(module, sys.argv[1:] if argv is None else argv)
    report = {"command": command, "date": datetime.now(UTC).isoformat(timespec="seconds"), **head, **report}
    print(json.dumps(report, indent=2, default=str))
    if out is not None:
        write_json(out, report)
    return 0 if report.get("passed") else 1
