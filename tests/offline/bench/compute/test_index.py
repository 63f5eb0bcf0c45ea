"""`seqrec bench index`: recall against exact search, the choice rule, and the CLI's tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from offline.bench.compute.index import choose, noisy_queries, recall_at, structure_spec, synthetic_vectors


def test_recall_counts_shared_rows_and_ignores_padding() -> None:
    truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    found = np.array([[4, 3, 9, -1], [5, 6, 7, 8]])  # 2 of 4, then 4 of 4
    assert recall_at(found, truth) == pytest.approx(6 / 8)
    assert recall_at(truth, truth) == 1.0


@pytest.mark.parametrize("distribution", ["clustered", "gaussian"])
def test_synthetic_vectors_are_unit_rows_and_reproducible(distribution: str) -> None:
    a = synthetic_vectors(5000, 16, distribution, seed=3)  # type: ignore[arg-type]
    b = synthetic_vectors(5000, 16, distribution, seed=3)  # type: ignore[arg-type]
    assert a.shape == (5000, 16)
    assert a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, synthetic_vectors(5000, 16, distribution, seed=4))  # type: ignore[arg-type]


def test_clustered_catalogue_has_neighbourhoods_a_gaussian_one_lacks() -> None:
    """Mean cosine to the nearest other item: items near a shared centre are far closer than random ones."""
    def nearest_cosine(x: np.ndarray) -> float:
        sims = x @ x.T
        np.fill_diagonal(sims, -np.inf)
        return float(sims.max(axis=1).mean())

    clustered = synthetic_vectors(2000, 32, "clustered", seed=0, spread=0.3)
    gaussian = synthetic_vectors(2000, 32, "gaussian", seed=0)
    assert nearest_cosine(clustered) > nearest_cosine(gaussian) + 0.2


def test_queries_for_a_real_catalogue_are_near_but_not_members() -> None:
    vectors = synthetic_vectors(500, 16, "gaussian", seed=0)
    queries = noisy_queries(vectors, 50, seed=1)
    best = (queries @ vectors.T).max(axis=1)
    assert np.all(best < 0.9999)
    assert np.all(best > 0.8)


def test_choose_takes_the_cheapest_setting_per_structure_then_the_fastest() -> None:
    rows = [
        {"structure": "flat", "recall@100": 1.0, "batch1_p50_ms": 9.0},
        {"structure": "hnsw", "recall@100": 0.95, "batch1_p50_ms": 0.1},
        {"structure": "hnsw", "recall@100": 0.985, "batch1_p50_ms": 0.4},  # cheapest hnsw at target
        {"structure": "hnsw", "recall@100": 0.999, "batch1_p50_ms": 0.9},
        {"structure": "ivf", "recall@100": 0.99, "batch1_p50_ms": 0.6},
    ]
    assert choose(rows, 100, 0.98) is rows[2]
    assert choose(rows, 100, 0.995) is rows[3]
    assert choose(rows[:1], 100, 0.98) is rows[0]  # only exact search reaches it
    assert choose(rows[1:2], 100, 0.98) is None


def test_structure_spec_refuses_unknown_names() -> None:
    from common.errors import SeqrecError

    assert structure_spec("ivfpq", 10_000, 64).pq_m == 32
    with pytest.raises(SeqrecError, match="unknown index structure"):
        structure_spec("annoy", 10_000, 64)


def test_cli_writes_tables_with_exact_recall_one_and_a_recommendation(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    done = subprocess.run(
        [sys.executable, "-m", "offline.cli", "bench", "index", "--sizes", "3000", "--dim", "16", "--queries", "200",
         "--latency-queries", "20", "--k", "10", "--structures", "hnsw,ivf", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "index.json").read_text())
    (size,) = report["sizes"]
    flat = [r for r in size["rows"] if r["structure"] == "flat"]
    assert len(flat) == 1
    assert flat[0]["recall@10"] == 1.0
    assert {r["structure"] for r in size["rows"]} == {"flat", "hnsw", "ivf"}
    assert all(0.0 <= r["recall@10"] <= 1.0 and r["batch1_p50_ms"] > 0 for r in size["rows"])
    # Recall grows (weakly) with search effort along each sweep.
    for structure in ("hnsw", "ivf"):
        recalls = [r["recall@10"] for r in size["rows"] if r["structure"] == structure]
        assert recalls == sorted(recalls)
    assert size["choice"] is not None
    assert size["choice"]["recall@10"] >= 0.98
    assert "recommended:" in (out / "index.md").read_text()


def test_cli_refuses_a_bad_vectors_file(tmp_path: Path) -> None:
    bad = tmp_path / "v.npy"
    bad.write_text("not numpy")
    done = subprocess.run(
        [sys.executable, "-m", "offline.cli", "bench", "index", "--vectors", str(bad), "--sizes", "100",
         "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1
    assert "cannot read" in done.stderr
    assert "Traceback" not in done.stderr
