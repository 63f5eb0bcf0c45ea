"""A bundle whose ranker reranks the union of the retriever's and the co-occurrence source's candidates, with
the extra features: every test user is served over HTTP what `seqrec evaluate` counts (the claim of
`test_parity.test_every_test_user_is_served_as_evaluated`, for the second source), and the union is what
the ranker saw (recorded recall, depth)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline.bench.parity import TOLERANCE, compare
from offline.cli import main as seqrec
from offline.data.prepared import load_prepared
from offline.jobs.evaluate import evaluate_bundle
from ranker.extras import EXTRA_FEATURES
from tests.service.support import Server, serving, train_bundle

DEPTH = 20


@pytest.fixture(scope="module")
def cooc_bundle(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = train_bundle(prepared, tmp_path_factory.mktemp("bundles") / "cooc", seed=3, ranker=False)
    assert seqrec(["train-ranker", "--artifact", str(out), "--data", str(prepared), "--kind", "lgbm", "--mining",
                   "direct", "--depth", str(DEPTH), "--threads", "1", "--sources", "retriever,cooc",
                   "--cooc-share", "0.25", "--features", ",".join(EXTRA_FEATURES), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def cooc_api(cooc_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("cooc-api"), artifacts=str(cooc_bundle)) as server:
        yield server


def test_the_bundle_records_its_sources_and_features(cooc_bundle: Path, prepared: Path) -> None:
    manifest = json.loads((cooc_bundle / "ranker" / "manifest.json").read_text())
    assert manifest["sources"]["names"] == ["retriever", "cooc"]
    assert manifest["features"]["dense"][-len(EXTRA_FEATURES):] == list(EXTRA_FEATURES)
    assert "cooc.npz" in manifest["sha256"]
    result = evaluate_bundle(cooc_bundle, load_prepared(prepared))
    # the recall the evaluation counts is the union's, the one the ranker was trained on
    assert result[f"recall@{DEPTH}"]["valid"] == pytest.approx(manifest["sources"][f"recall@{DEPTH}"]["valid"])
    assert result["valid"]["NDCG@10"] == pytest.approx(manifest["metrics"]["valid"]["NDCG@10"])


def test_every_test_user_is_served_the_evaluated_union(cooc_api: Server, cooc_bundle: Path, prepared: Path) -> None:
    data = load_prepared(prepared)
    parity = compare(cooc_api.url, cooc_bundle, data, k=10)
    assert parity.users == data.n_users
    assert parity.differ == [], parity.line()
    assert abs(parity.served_ndcg - parity.offline_ndcg) <= TOLERANCE, parity.line()
