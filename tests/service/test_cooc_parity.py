"""A bundle whose ranker reranks the union of the retriever's and the co-occurrence source's candidates, with
every extra feature (the request-time ones included): every test user is served over HTTP what `seqrec evaluate`
counts (the claim of `test_parity.test_every_test_user_is_served_as_evaluated`, for the second source and for
requests made at the test target's time), and the union is what the ranker saw (recorded recall, depth)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from offline.analysis.predictions import readable_predictions
from offline.bench.quality import request_times
from offline.bench.quality.parity import TOLERANCE, compare
from offline.cli import main as seqrec
from offline.data.prepared import load_prepared
from offline.jobs.evaluate import evaluate_bundle, two_stage_top
from ranker.artifact import load_ranker
from ranker.groups import optional_columns
from retriever.artifact import ArtifactError, load_artifact
from tests.service.support import Server, serving, train_bundle

DEPTH = 20


@pytest.fixture(scope="module")
def cooc_bundle(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = train_bundle(prepared, tmp_path_factory.mktemp("bundles") / "cooc", seed=3, ranker=False)
    assert seqrec(["train-ranker", "--artifact", str(out), "--data", str(prepared), "--kind", "lgbm", "--mining",
                   "direct", "--depth", str(DEPTH), "--threads", "1", "--sources", "retriever,cooc",
                   "--cooc-share", "0.25", "--features", ",".join(optional_columns()), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def cooc_api(cooc_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("cooc-api"), artifacts=str(cooc_bundle)) as server:
        yield server


def test_the_bundle_records_its_sources_and_features(cooc_bundle: Path, prepared: Path) -> None:
    manifest = json.loads((cooc_bundle / "ranker" / "manifest.json").read_text())
    assert manifest["sources"]["names"] == ["retriever", "cooc"]
    assert manifest["features"]["dense"][-len(optional_columns()):] == list(optional_columns())
    assert "cooc.npz" in manifest["sha256"]
    assert "times.npz" in manifest["sha256"]
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


def test_a_stored_history_is_scored_with_its_events_times(cooc_api: Server, prepared: Path) -> None:
    """user_idle_days reads the newest interaction's time: from a stored history's events as from a request's
    `last_event_at`; the served scores move with `at` (the request-time columns are read)."""
    data = load_prepared(prepared)
    split = data.split()
    inputs = split.inputs("test")
    assert inputs.timestamps is not None
    row = inputs.row(0)
    history = [str(data.item_ids[i]) for i in row]
    stamps = inputs.timestamps[inputs.offsets[0]:inputs.offsets[1]].astype(float).tolist()
    at = stamps[-1] + 3 * 86_400
    user = f"timed-{uuid.uuid4().hex}"
    with cooc_api.client() as client:
        events = [{"user_id": user, "item_id": i, "timestamp": t} for i, t in zip(history, stamps, strict=True)]
        assert client.post("/events", json={"events": events}).status_code == 200
        by_user = client.post("/recommend", json={"user_id": user, "k": 10, "at": at})
        by_history = client.post("/recommend", json={"history": history, "last_event_at": stamps[-1], "k": 10,
                                                     "at": at})
        later = client.post("/recommend", json={"history": history, "last_event_at": stamps[-1], "k": 10,
                                                "at": at + 400 * 86_400})
    for response in (by_user, by_history, later):
        assert response.status_code == 200, response.text
    assert by_user.json()["items"] == by_history.json()["items"]
    assert [i["score"] for i in later.json()["items"]] != [i["score"] for i in by_history.json()["items"]]


@pytest.mark.parametrize("body", [
    {"history": ["i1"], "at": -1},
    {"history": ["i1"], "at": "yesterday"},
    {"history": ["i1"], "last_event_at": -3.0},
    {"history": ["i1"], "last_event_at": 1_700_000_000_000},  # milliseconds
])
def test_bad_times_are_a_422(cooc_api: Server, body: dict[str, object]) -> None:
    with cooc_api.client() as client:
        response = client.post("/recommend", json=body)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("name", ["times.npz", "cooc.npz"])
def test_a_ranker_whose_table_is_not_listed_is_refused(cooc_bundle: Path, tmp_path: Path, name: str) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(cooc_bundle, copy)
    path = copy / "ranker" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["sha256"][name]
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"lists no {name}"):
        load_ranker(copy, load_artifact(copy).manifest)


def test_readable_predictions_rerank_the_evaluated_union(cooc_bundle: Path, prepared: Path) -> None:
    """The analysis report's reranked lists are the lists `seqrec evaluate` counts (and the service returns): the
    union of both sources, not the retriever's candidates alone."""
    data = load_prepared(prepared)
    rows = np.arange(data.n_users)
    shown = readable_predictions({"cooc": load_artifact(cooc_bundle)}, data, rows)
    evaluated, _ = two_stage_top(cooc_bundle, data)
    for row, user in zip(rows.tolist(), shown, strict=True):
        expected = [str(data.item_ids[i]) for i in evaluated.top[row] if i != 0]
        assert [e["id"] for e in user["lists"]["cooc"]["reranked"]] == expected, user["user_id"]


def test_the_request_time_bench_starts_from_the_evaluated_figures(cooc_bundle: Path, prepared: Path,
                                                                   tmp_path: Path) -> None:
    result = request_times.run(cooc_bundle, prepared)
    evaluated = evaluate_bundle(cooc_bundle, load_prepared(prepared))
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == list(request_times.VARIANTS)
    first = rows[next(iter(request_times.VARIANTS))]
    assert first["valid"] == pytest.approx(evaluated["valid"]["NDCG@10"])
    assert first["test"] == pytest.approx(evaluated["test"]["NDCG@10"])
    assert result["features"] == list(optional_columns())
    assert request_times.main(["--artifact", str(cooc_bundle), "--data", str(prepared), "--out",
                               str(tmp_path / "rt")]) == 0
    written = json.loads((tmp_path / "rt.json").read_text())["rows"]
    clock_free = [0, 1, 3]  # every variant but "the clock when the bench ran" repeats exactly
    assert [written[i] for i in clock_free] == [result["rows"][i] for i in clock_free]
    assert "| requests carry |" in (tmp_path / "rt.md").read_text()
