"""Kill -9 a training job and a publish; `current` must stay complete and --resume must finish.

    python -m offline.bench.training_faults --config configs/pipeline/demo.yaml --work /tmp/faults

1. Reference: an uninterrupted `seqrec pipeline` run (seeded by its configs) into WORK/ref.
2. Kill during training: the same pipeline into WORK/killed, whose `current` already holds a
   first bundle; SIGKILL once the training has written its first checkpoint
   (work/*/bundle/run/last.pt); check that `current` still loads (checksums, smoke query);
   `--resume` finishes; its retriever's validation NDCG@10 must be within --tolerance of the
   reference (resume restores model, optimiser, RNG and early-stopping state).
3. Kill during publish: SEQREC_FAULT_INJECT=publish-before-switch SIGKILLs the pipeline after the
   bundle moved into versions/ and before `current` switched; `current` must still be the old,
   complete bundle; `--resume` must switch it.
Prints a JSON report; exits 1 when a check fails.
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

from offline.jobs.versions import CURRENT, VERSIONS


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
    from service.bundle import load_bundle

    return load_bundle(artifacts / CURRENT).version  # raises on a partial or corrupt bundle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/pipeline/demo.yaml"))
    parser.add_argument("--work", type=Path, required=True, help="empty scratch folder")
    parser.add_argument("--tolerance", type=float, default=0.01, help="|valid NDCG@10 - reference| allowed")
    args = parser.parse_args()
    ref, killed = args.work / "ref", args.work / "killed"
    report: dict[str, Any] = {"config": str(args.config), "tolerance": args.tolerance}

    start = time.perf_counter()
    finished(pipeline(args.config, ref), "reference run")
    report["reference"] = {"valid_ndcg@10": valid_ndcg(ref), "seconds": round(time.perf_counter() - start, 1)}

    finished(pipeline(args.config, killed), "first run")
    before = current_ok(killed)
    process = pipeline(args.config, killed)
    while not list(killed.glob("work/*/bundle/run/last.pt")):
        if process.poll() is not None:
            raise SystemExit("the run ended before its first checkpoint: use a longer training config")
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    state = json.loads(next(killed.glob("work/*/state.json")).read_text())
    after_kill = current_ok(killed)
    finished(pipeline(args.config, killed, "--resume"), "resumed run")
    resumed = json.loads((killed / CURRENT / "pipeline.json").read_text())
    report["kill_during_training"] = {
        "signal": "SIGKILL", "stages_done_at_kill": list(state["stages"]),
        "current_before": before, "current_after_kill": after_kill, "current_intact": after_kill == before,
        "resumed_training": resumed["stages"]["train"]["resumed"], "valid_ndcg@10": valid_ndcg(killed),
        "difference": round(abs(valid_ndcg(killed) - report["reference"]["valid_ndcg@10"]), 6),
        "current_after_resume": current_ok(killed),
    }

    before = current_ok(killed)
    process = pipeline(args.config, killed, env={"SEQREC_FAULT_INJECT": "publish-before-switch"})
    process.wait()
    after_kill = current_ok(killed)
    moved = sorted(p.name for p in (killed / VERSIONS).iterdir())
    finished(pipeline(args.config, killed, "--resume"), "resumed publish")
    report["kill_during_publish"] = {
        "exit_code": process.returncode, "current_before": before, "current_after_kill": after_kill,
        "current_intact": after_kill == before, "versions_after_kill": moved,
        "current_after_resume": current_ok(killed), "switched": current_ok(killed) != before,
    }
    training, publish = report["kill_during_training"], report["kill_during_publish"]
    ok = (training["current_intact"] and training["resumed_training"] and training["difference"] <= args.tolerance
          and publish["exit_code"] == -signal.SIGKILL and publish["current_intact"] and publish["switched"])
    report["passed"] = ok
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
