"""offline/bench/train/trm4rec_stall.py on a tiny finished run: it reads the checkpoint, TensorBoard and the model,
and refuses a run whose checkpoint went past --epochs (the full-size run is in docs/results/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from offline.cli import main

SCRIPT = Path(__file__).resolve().parents[4] / "offline" / "bench" / "train" / "trm4rec_stall.py"


def _stall(config: Path, data: Path, out: Path, epochs: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config), "--data", str(data), "--out", str(out),
         "--seeds", "7", "--epochs", str(epochs), "--settle", "0", "--window", "4", "--windows", "16",
         "--batches", "2"], capture_output=True, text=True, timeout=120)


def test_reports_a_finished_run_and_refuses_one_past_epochs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "80", "--n-items", "40", "--mean-length", "10",
                 "--out", str(data), "-q"]) == 0
    config = tmp_path / "trm4rec.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"backbone": "trm4rec", "d_model": 16, "n_heads": 2, "n_blocks": 2, "n_steps": 3, "max_len": 10},
        "train": {"epochs": 2, "patience": 2, "batch_size": 32, "threads": 1},
    }))
    out = tmp_path / "stall"
    assert main(["train", "--config", str(config), "--data", str(data), "--out", str(out / "seed7"), "--seed", "7",
                 "-q"]) == 0
    history = json.loads(torch.load(out / "seed7" / "run" / "last.pt", weights_only=True)["history"])

    done = _stall(config, data, out, epochs=2)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 7 |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[1] == "2"
    assert cells[2] == f"{history[-1]['loss']:.2f}"
    assert cells[3] == f"{history[-1]['valid']['NDCG@10']:.4f}"
    states = [float(v) for v in cells[6].split(",")]
    assert len(states) == 1 + 3  # the embeddings, then one norm per recursion step
    assert all(v > 0 for v in states)

    past = _stall(config, data, out, epochs=1)
    assert past.returncode != 0
    assert "checkpoint is at epoch 2, not 1" in past.stderr
