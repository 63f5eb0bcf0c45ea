"""kill -9 during training and during publish: `current` stays complete, `--resume` finishes the run
and reaches the uninterrupted run's validation metric (offline/bench/faults/training_faults.py is the full-size run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from service.system.loader import load_bundle


def _config(tmp_path: Path, *, epochs: int = 60, seed: int = 5, name: str = "pipeline") -> Path:
    """60 epochs: slow enough (a few seconds) to be killed mid-training; seeded."""
    retriever = {
        "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
        "train": {"epochs": epochs, "patience": epochs, "batch_size": 32, "seed": seed, "threads": 1},
    }
    (tmp_path / f"{name}-retriever.yaml").write_text(yaml.safe_dump(retriever))
    config = {"name": "faults", "retriever": f"{name}-retriever.yaml", "ranker": {"kind": "none"},
              "data": {"dataset": "synthetic", "synthetic": {"n_users": 300, "n_items": 60, "mean_length": 12,
                                                             "seed": 1}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _start(config: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "offline.cli", "pipeline", "--config", str(config), "--out",
                             str(out), "-q", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})


def _run(config: Path, out: Path, *extra: str) -> None:
    process = _start(config, out, *extra)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()


def _valid(out: Path) -> float:
    return float(json.loads((out / "current" / "pipeline.json").read_text())["stages"]["train"]["valid_ndcg@10"])


def test_kill_during_training_keeps_current_and_resume_reaches_the_same_metric(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _run(config, tmp_path / "ref")
    out = tmp_path / "killed"
    _run(config, out)
    served = load_bundle(out / "current").version
    process = _start(config, out)
    deadline = time.monotonic() + 120
    while not list(out.glob("work/*/bundle/run/last.pt")):
        assert process.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert load_bundle(out / "current").version == served  # still the complete earlier bundle
    _run(config, out, "--resume")
    record = json.loads((out / "current" / "pipeline.json").read_text())
    assert record["stages"]["train"]["resumed"] is True
    assert load_bundle(out / "current").version != served
    # seed 5, one thread: resume restores the RNG state, so it ends where the uninterrupted run does
    assert _valid(out) == pytest.approx(_valid(tmp_path / "ref"), abs=1e-6)


def test_kill_during_publish_keeps_current_and_resume_switches(tmp_path: Path) -> None:
    out = tmp_path / "a"
    _run(_config(tmp_path, epochs=2, name="first"), out)
    served = load_bundle(out / "current").version
    config = _config(tmp_path, epochs=2, seed=6)  # other weights: another version
    process = _start(config, out, env={"SEQREC_FAULT_INJECT": "publish-before-switch"})
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL
    assert load_bundle(out / "current").version == served
    assert len(list((out / "versions").iterdir())) == 2  # moved in, not yet switched to
    _run(config, out, "--resume")
    assert load_bundle(out / "current").version != served
