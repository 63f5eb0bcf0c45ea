"""`python -m offline.bench.compute.compiled` on a tiny model: every cell timed on both paths, the same vectors."""

import json
from pathlib import Path

import yaml

from offline.bench.compute.compiled import main
from tests.tiny import prepare_tiny


def test_the_bench_times_both_paths_and_writes_its_tables(tmp_path: Path) -> None:
    data = prepare_tiny(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": {"backbone": "transformer", "d_model": 16, "n_layers": 1,
                                                "n_heads": 2, "max_len": 10}}))
    out = tmp_path / "out"
    assert main(["--case", "tiny", str(config), str(data), "--out", str(out), "--batches", "1,4",
                 "--lengths", "6,10,50", "--reps", "3", "--warmup", "1", "--mlp-batches", "2",
                 "--candidates", "7", "--mlp-members", "1,3"]) == 0
    record = json.loads((out / "compiled.json").read_text())
    (case,) = record["cases"]
    assert case["max_len"] == 10
    assert case["lengths_over_max_len"] == [50]
    assert [(r["length"], r["batch"]) for r in case["rows"]] == [(6, 1), (6, 4), (10, 1), (10, 4)]
    for row in case["rows"]:
        assert row["eager_ms"] > 0
        assert row["onnx_ms"] > 0
        assert row["speedup"] == round(row["eager_ms"] / row["onnx_ms"], 2)
        assert row["cpu_speedup"] == round(row["eager_cpu_ms"] / row["onnx_cpu_ms"], 2)
        assert row["max_abs_diff"] <= 1e-4
    assert [(r["members"], r["batch"], r["candidates"]) for r in case["mlp_rows"]] == [(1, 2, 7), (3, 2, 7)]
    for mlp in case["mlp_rows"]:  # an ensemble compiles to one graph that scores as the eager ensemble
        assert mlp["max_abs_diff"] <= 1e-4
    table = (out / "compiled.md").read_text()
    assert "| tiny | 6 | 1 |" in table
    assert "| tiny | 3 | 2 | 7 |" in table
    assert "lengths [50] exceed its max_len" in table
