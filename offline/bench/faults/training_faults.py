"""Kill -9 a training job and a publish; `current` must stay complete and --resume must finish.

    python -m offline.bench.faults.training_faults --config configs/pipeline/demo.yaml --work /tmp/faults \
        [--out docs/results/reliability/training-faults.json]

1. Reference: an uninterrupted `seqrec pipeline` run (seeded by its configs) into WORK/ref.
2. Kill during training: the same pipeline into WORK/killed, whose `current` already holds a
   first bundle; SIGKILL one second (KILL_AFTER_CHECKPOINT_S) after the training has written its
   first checkpoint (work/*/bundle/run/last.pt); check that `current` still loads (checksums, smoke
   query); `--resume` finishes; its retriever's validation NDCG@10 must be within --tolerance of the
   reference (resume restores model, optimiser, RNG and early-stopping state).
3. Kill during publish: SEQREC_FAULT_INJECT=publish-before-switch SIGKILLs the pipeline after the
   bundle moved into versions/ and before `current` switched; `current` must still be the old,
   complete bundle; `--resume` must switch it.
Prints a JSON report (also written to --out); exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from offline.bench.faults.reliability import Started, add_out_option, print_report
from offline.jobs.versions import CURRENT, VERSIONS

KILL_AFTER_CHECKPOINT_S = 1.0


def pipeline(config: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "offline.cli", "pipeline", "--config", str(config), "--out", str(out),
               "--threads", "1", "-q", *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})


def finished(process: subprocess.Popen[bytes], what: str) -> None:
    if process.wait() != 0:
        raise SystemExit(f"{what} failed with exit code {process.returncode}")


def valid_ndcg(artifacts: Path) -> float:
    record = json.loads((artifacts / CURRENT / "pipeline.json").read_text())
    return float(record["stages"]["train"]["valid_ndcg@10"])


def current_ok(artifacts: Path) -> str:
    from service.system.loader import load_bundle

    return load_bundle(artifacts / CURRENT).version  # raises on a partial or corrupt bundle


def kill_during_training(config: Path, killed: Path, reference_ndcg: float) -> dict[str, Any]:
    """Step 2: a first bundle in ``killed``, then a run killed after its first checkpoint, then --resume."""
    finished(pipeline(config, killed), "first run")
    before = current_ok(killed)
    process = pipeline(config, killed)
    while not list(killed.glob("work/*/bundle/run/last.pt")):
        if process.poll() is not None:
            raise SystemExit("the run ended before its first checkpoint: use a longer training config")
        time.sleep(0.2)
    time.sleep(KILL_AFTER_CHECKPOINT_S)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    state = json.loads(next(killed.glob("work/*/state.json")).read_text())
    after_kill = current_ok(killed)
    finished(pipeline(config, killed, "--resume"), "resumed run")
    resumed = json.loads((killed / CURRENT / "pipeline.json").read_text())
    return {
        "signal": "SIGKILL", "seconds_after_first_checkpoint": KILL_AFTER_CHECKPOINT_S,
        "stages_done_at_kill": list(state["stages"]),
        "current_before": before, "current_after_kill": after_kill, "current_intact": after_kill == before,
        "resumed_training": resumed["stages"]["train"]["resumed"], "valid_ndcg@10": valid_ndcg(killed),
        "difference": round(abs(valid_ndcg(killed) - reference_ndcg), 6),
        "current_after_resume": current_ok(killed),
    }


def kill_during_publish(config: Path, killed: Path) -> dict[str, Any]:
    """Step 3: a run killed between moving its bundle into versions/ and switching `current`, then --resume."""
    before = current_ok(killed)
    process = pipeline(config, killed, env={"SEQREC_FAULT_INJECT": "publish-before-switch"})
    process.wait()
    after_kill = current_ok(killed)
    moved = sorted(p.name for p in (killed / VERSIONS).iterdir())
    finished(pipeline(config, killed, "--resume"), "resumed publish")
    return {
        "exit_code": process.returncode, "current_before": before, "current_after_kill": after_kill,
        "current_intact": after_kill == before, "versions_after_kill": moved,
        "current_after_resume": current_ok(killed), "switched": current_ok(killed) != before,
    }


def training_faults(config: Path, work: Path, tolerance: float) -> dict[str, Any]:
    """The three steps in WORK; the report, with ``passed``."""
    report: dict[str, Any] = {"config": str(config), "tolerance": tolerance}
    start = time.perf_counter()
    finished(pipeline(config, work / "ref"), "reference run")
    report["reference"] = {"valid_ndcg@10": valid_ndcg(work / "ref"), "seconds": round(time.perf_counter() - start, 1)}
    training = report["kill_during_training"] = kill_during_training(config, work / "killed",
                                                                     report["reference"]["valid_ndcg@10"])
    publish = report["kill_during_publish"] = kill_during_publish(config, work / "killed")
    report["passed"] = bool(
        training["current_intact"] and training["resumed_training"] and training["difference"] <= tolerance
        and publish["exit_code"] == -signal.SIGKILL and publish["current_intact"] and publish["switched"])
    return report


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--work", type=Path, required=True, help="empty scratch folder")
    parser.add_argument("--tolerance", type=float, default=0.01, help="|valid NDCG@10 - reference| allowed")
    add_out_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    started = Started()
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    report = training_faults(args.config, args.work, args.tolerance)
    return print_report(report, "offline.bench.faults.training_faults", argv, args.out, **started.head())


if __name__ == "__main__":
    raise SystemExit(main())
