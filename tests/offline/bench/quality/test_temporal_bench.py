"""`python -m offline.bench.quality.temporal` end to end on tiny synthetic data (slow: four trainings)."""

import json
from pathlib import Path

import pytest

from offline.bench.quality.temporal import main as bench_main
from offline.data.prepared import load_prepared
from offline.data.temporal import temporal_split
from tests.tiny import prepare_tiny

TINY_OVERRIDES = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.max_len=10", "train.epochs=2"]


@pytest.mark.slow
def test_bench_writes_both_protocols_side_by_side_and_reads_runs_back(tmp_path: Path) -> None:
    data = prepare_tiny(tmp_path / "data")
    out = tmp_path / "result.json"
    argv = ["--data", str(data), "--work", str(tmp_path / "work"), "--out", str(out), "--refit",
            "--configs", "configs/ml-100k/sasrec.yaml", "--override", *TINY_OVERRIDES]
    assert bench_main(argv) == 0
    record = json.loads(out.read_text())
    assert {(r["model"], r["protocol"]) for r in record["runs"]} == {
        (m, p) for m in ("popularity", "personal-frequency", "sasrec") for p in ("loo", "temporal")}
    temporal = next(r for r in record["runs"] if r["model"] == "sasrec" and r["protocol"] == "temporal")
    assert temporal["temporal"]["refit"] is True
    assert temporal["temporal"]["test"]["users"] == temporal_split(load_prepared(data).sequences).test.record()["users"]
    assert set(record["rankings"]["loo"]) == {"popularity", "personal-frequency", "sasrec"}
    rows = record["rankings"]["temporal"]
    assert {m: r["rank"] for m, r in rows.items()} == {  # equal means share a rank
        m: 1 + sum(o["test"] > r["test"] for o in rows.values()) for m, r in rows.items()}
    frequency = next(r for r in record["runs"] if r["model"] == "personal-frequency" and r["protocol"] == "loo")
    assert frequency["valid_by_decay"][str(frequency["decay"])] == frequency["valid"]["NDCG@10"]
    assert (tmp_path / "result.md").read_text().startswith("| model |")
    assert bench_main(argv) == 0  # again: the trained runs are read back, not retrained
    again = json.loads(out.read_text())
    assert all(r["read_back"] for r in again["runs"] if r["model"] == "sasrec")
    assert [r["test"] for r in again["runs"]] == [r["test"] for r in record["runs"]]
