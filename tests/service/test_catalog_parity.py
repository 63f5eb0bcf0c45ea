"""`seqrec evaluate` counts the catalogue the service serves: a bundle's journal of items retired and added
(`service.system.catalog`) applied, in the two-stage evaluation and in the retriever's FAISS-index figures, and every
test user's served list equal to the one the evaluation ranked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from offline.bench.quality.parity import TOLERANCE, compare
from offline.cli import main as seqrec
from offline.data.prepared import load_prepared
from offline.jobs.evaluate import evaluate_bundle, two_stage_top
from service.system.catalog import CatalogChanges, write_journal
from tests.service.support import serving

K = 10


@pytest.fixture(scope="module")
def changed(featured: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the featured bundle whose journal retires the five test targets found in the most top-10 lists
    and adds two items, one the model gives a vector (known genres) and one it cannot."""
    copy = Path(shutil.copytree(featured, tmp_path_factory.mktemp("changed") / "bundle"))
    data = load_prepared(prepared)
    reranked, targets = two_stage_top(featured, data, k=K)
    hits = np.bincount(targets[reranked.ranks <= K])
    frequent = np.argsort(-hits, kind="stable")[:5]
    assert (hits[frequent] > 0).all()
    added = [{"item_id": "new-1", "genres": ["Comedy", "Drama"]}, {"item_id": "new-2", "genres": ["No such genre"]}]
    write_journal(copy, CatalogChanges(added=added, retired=[str(data.item_ids[i]) for i in frequent]))
    return copy


def test_two_stage_evaluation_counts_what_is_served(changed: Path, featured: Path, prepared: Path,
                                                     tmp_path: Path) -> None:
    data = load_prepared(prepared)
    before, after = evaluate_bundle(featured, data), evaluate_bundle(changed, data)
    assert "catalogue" not in before
    assert after["catalogue"] == {"retired": 5, "added": 1, "added_without_vector": 1}
    # the retired targets are misses now: what the service can deliver for those users
    assert after["test"]["NDCG@10"] < before["test"]["NDCG@10"]
    with serving(tmp_path / "served", artifacts=str(changed)) as server:
        parity = compare(server.url, changed, data, k=K)
    assert parity.users == data.n_users
    assert parity.differ == [], parity.line()
    assert abs(parity.offline_ndcg - after["test"]["NDCG@10"]) <= 1e-6
    assert abs(parity.served_ndcg - parity.offline_ndcg) <= TOLERANCE, parity.line()


def test_retriever_index_figures_count_what_is_served(changed: Path, prepared: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A bundle without a ranker: `seqrec evaluate`'s ``index`` block is the served retrieval, journal applied."""
    alone = Path(shutil.copytree(changed, tmp_path / "retriever"))
    shutil.rmtree(alone / "ranker")
    data = load_prepared(prepared)
    capsys.readouterr()
    assert seqrec(["evaluate", "--artifact", str(alone), "--data", str(prepared), "-q"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["index"]["catalogue"]["retired"] == 5
    assert result["index"]["test"]["NDCG@10"] < result["test"]["NDCG@10"]  # dense: the model, every item
    with serving(tmp_path / "served", artifacts=str(alone)) as server:
        parity = compare(server.url, alone, data, k=K)
    assert parity.differ == [], parity.line()
    assert abs(parity.served_ndcg - result["index"]["test"]["NDCG@10"]) <= TOLERANCE, parity.line()
