"""The HTTP API of a real uvicorn process serving the tiny bundle (in-process history store, no API key).

Every test writes under its own user ids, so they share one server."""

from __future__ import annotations

import importlib.metadata
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.service.support import Server, metric_samples


@pytest.fixture(scope="module")
def client(api: Server) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


@pytest.fixture(scope="module")
def catalogue(bundle: Path) -> list[str]:
    """The bundle's external item ids, in internal-id order."""
    return [str(i) for i in np.load(bundle / "item_ids.npy", allow_pickle=False)]


@pytest.fixture(scope="module")
def ready(client: httpx.Client) -> dict[str, Any]:
    body: dict[str, Any] = client.get("/readyz").json()
    return body


def _user() -> str:
    return f"user-{uuid.uuid4().hex[:12]}"


def _recommend(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/recommend", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _ids(answer: dict[str, Any]) -> list[str]:
    return [item["item_id"] for item in answer["items"]]


def _pairs(answer: dict[str, Any]) -> list[tuple[str, float, float]]:
    return [(i["item_id"], i["score"], i["retrieval_score"]) for i in answer["items"]]


def test_recommend_with_history(client: httpx.Client, catalogue: list[str], ready: dict[str, Any]) -> None:
    history = catalogue[:5]
    answer = _recommend(client, history=history, k=7)
    assert answer["model_version"] == ready["model_version"]
    assert answer["reranked"] is True
    assert answer["unknown_items"] == []
    assert answer["fallback"] is None  # present, as null
    assert answer["history_used"] == 5
    assert set(answer["timing_ms"]) == {"queue", "encode", "search", "rerank", "total"}
    timing = answer["timing_ms"]
    assert all(v >= 0 for v in timing.values())
    assert timing["encode"] > 0  # a history sent with the request is encoded
    # the parts of the request's time (total also counts parsing and the store read before them)
    assert timing["queue"] + timing["encode"] + timing["search"] + timing["rerank"] <= timing["total"] + 1e-6
    items = answer["items"]
    assert [i["rank"] for i in items] == list(range(1, 8))
    assert len(set(_ids(answer))) == 7
    assert set(_ids(answer)) <= set(catalogue) - set(history)
    scores = [i["score"] for i in items]
    assert scores == sorted(scores, reverse=True)
    # the same request twice: the same answer
    assert _pairs(_recommend(client, history=history, k=7)) == _pairs(answer)


def test_int_ids_are_matched_as_strings(client: httpx.Client, catalogue: list[str]) -> None:
    """The catalogue's ids are "i1".."i60": the ints 1 and 2 are other ids (unknown), sent back as strings."""
    answer = _recommend(client, history=[1, catalogue[0], 2, 1], k=5)
    assert answer["unknown_items"] == ["1", "2"]
    assert answer["history_used"] == 1
    assert _pairs(answer) == _pairs(_recommend(client, history=[catalogue[0]], k=5))


def test_unknown_items_are_reported_and_ignored(client: httpx.Client, catalogue: list[str]) -> None:
    history = ["nope", catalogue[3], "i999", "nope", catalogue[8]]
    answer = _recommend(client, history=history, k=5)
    assert answer["unknown_items"] == ["nope", "i999"]  # once each, in order of appearance
    assert answer["history_used"] == 2
    assert answer["fallback"] is None
    assert _pairs(answer) == _pairs(_recommend(client, history=[catalogue[3], catalogue[8]], k=5))


def test_popularity_fallback_without_usable_history(client: httpx.Client, bundle: Path,
                                                    catalogue: list[str]) -> None:
    counts = np.load(bundle / "popularity.npy", allow_pickle=False)
    by_popularity = np.argsort(-counts[1:], kind="stable") + 1
    expected = [(catalogue[i - 1], float(counts[i])) for i in by_popularity[:6]]
    bodies: list[dict[str, Any]] = [{}, {"history": []}, {"history": ["nope", "i999"]}, {"user_id": _user()}]
    for body in bodies:
        answer = _recommend(client, **body, k=6)
        assert answer["fallback"] == "popularity", body
        assert answer["reranked"] is False
        assert answer["history_used"] == 0
        assert [(i["item_id"], i["score"]) for i in answer["items"]] == expected
        assert [i["rank"] for i in answer["items"]] == list(range(1, 7))
    assert _recommend(client, history=["nope", "i999"])["unknown_items"] == ["nope", "i999"]


def test_history_longer_than_max_len_is_cut(client: httpx.Client, catalogue: list[str],
                                            ready: dict[str, Any]) -> None:
    max_len = ready["max_len"]
    history = catalogue[: 3 * max_len]
    recent = history[-max_len:]
    answer = _recommend(client, history=history, k=10, exclude_seen=False)
    assert answer["history_used"] == max_len
    # the model reads the most recent max_len items: the same user vector, the same answer
    assert _pairs(answer) == _pairs(_recommend(client, history=recent, k=10, exclude_seen=False))
    # but the whole history stays excluded, not only the part the model read
    seen = set(_ids(_recommend(client, history=history, k=len(catalogue))))
    assert seen == set(catalogue) - set(history)


def test_exclude_seen(client: httpx.Client, catalogue: list[str]) -> None:
    history = catalogue[10:16]
    everything = len(catalogue)
    excluded = _recommend(client, history=history, k=everything)
    assert set(_ids(excluded)) == set(catalogue) - set(history)
    allowed = _recommend(client, history=history, k=everything, exclude_seen=False)
    assert set(_ids(allowed)) == set(catalogue)


def test_rerank_on_and_off(client: httpx.Client, catalogue: list[str]) -> None:
    history = catalogue[20:26]
    plain = _recommend(client, history=history, k=20, candidates=20, rerank=False)
    assert plain["reranked"] is False
    assert all(i["score"] == i["retrieval_score"] for i in plain["items"])
    retrieval = [i["retrieval_score"] for i in plain["items"]]
    assert retrieval == sorted(retrieval, reverse=True)

    reranked = _recommend(client, history=history, k=20, candidates=20)
    assert reranked["reranked"] is True
    # the same 20 candidates with the same retrieval scores, put in another order by the ranker
    assert {(i, r) for i, _, r in _pairs(reranked)} == {(i, r) for i, _, r in _pairs(plain)}
    assert any(i["score"] != i["retrieval_score"] for i in reranked["items"])
    scores = [i["score"] for i in reranked["items"]]
    assert scores == sorted(scores, reverse=True)


def test_k_and_candidates(client: httpx.Client, catalogue: list[str]) -> None:
    history = catalogue[30:34]
    for k in (1, 3, 12):
        assert len(_recommend(client, history=history, k=k)["items"]) == k
    retrieval_top5 = set(_ids(_recommend(client, history=history, k=5, rerank=False)))
    shallow = _recommend(client, history=history, k=3, candidates=5)
    assert shallow["reranked"] is True
    assert set(_ids(shallow)) <= retrieval_top5  # the ranker only sees the retriever's top 5
    best = _recommend(client, history=history, k=1, candidates=1)
    assert _ids(best) == _ids(_recommend(client, history=history, k=1, rerank=False))
    # fewer candidates than k: k are still retrieved
    assert len(_recommend(client, history=history, k=10, candidates=2)["items"]) == 10
    # k beyond the catalogue: every item not seen
    assert len(_recommend(client, history=history, k=1000)["items"]) == len(catalogue) - len(history)


def test_metadata_and_items(client: httpx.Client, bundle: Path, catalogue: list[str]) -> None:
    rows = {r["item_id"]: r for r in pq.read_table(bundle / "catalogue.parquet").to_pylist()}
    answer = _recommend(client, history=catalogue[:3], k=10)
    for item in answer["items"]:
        row = rows[item["item_id"]]
        assert item["title"] == row["title"]
        assert item["year"] == row["year"]
        assert item["genres"] == row["genres"]
        assert "attributes" not in item  # the synthetic catalogue has none: left out, not null
        assert client.get(f"/items/{item['item_id']}").json() == {
            "item_id": item["item_id"], "title": row["title"], "year": row["year"], "genres": row["genres"]}
    missing = client.get("/items/i999")
    assert missing.status_code == 404
    assert "i999" in missing.json()["detail"]


def test_events_then_recommend_by_user_id(client: httpx.Client, catalogue: list[str]) -> None:
    user, other = _user(), _user()
    first = client.post("/events", json={"user_id": user, "item_id": catalogue[5], "timestamp": 1_700_000_000})
    assert first.status_code == 200, first.text
    assert first.json() == {"stored": 1, "users": 1, "unknown_items": []}
    batch = {"events": [{"user_id": user, "item_id": catalogue[6]}, {"user_id": other, "item_id": catalogue[1]},
                        {"user_id": user, "item_id": "i999", "timestamp": 1_700_000_100.5},
                        {"user_id": user, "item_id": 7}]}
    second = client.post("/events", json=batch)
    assert second.status_code == 200, second.text
    assert second.json() == {"stored": 4, "users": 2, "unknown_items": ["i999", "7"]}

    history = client.get(f"/users/{user}/history").json()
    assert history == {"user_id": user, "items": [
        {"item_id": catalogue[5], "timestamp": 1_700_000_000.0}, {"item_id": catalogue[6]},
        {"item_id": "i999", "timestamp": 1_700_000_100.5}, {"item_id": "7"}]}

    by_user = _recommend(client, user_id=user, k=8)
    assert by_user["history_used"] == 2
    assert by_user["unknown_items"] == ["i999", "7"]
    assert _pairs(by_user) == _pairs(_recommend(client, history=[catalogue[5], catalogue[6]], k=8))
    # a history in the request wins over the stored one
    explicit = _recommend(client, user_id=user, history=[catalogue[40]], k=8)
    assert explicit["history_used"] == 1
    assert _pairs(explicit) == _pairs(_recommend(client, history=[catalogue[40]], k=8))


def test_stored_history_keeps_the_newest_max_len(client: httpx.Client, catalogue: list[str],
                                                 ready: dict[str, Any]) -> None:
    user, max_len = _user(), ready["max_len"]
    events = [{"user_id": user, "item_id": item} for item in catalogue[: max_len + 4]]
    assert client.post("/events", json={"events": events}).status_code == 200
    stored = [e["item_id"] for e in client.get(f"/users/{user}/history").json()["items"]]
    assert stored == catalogue[4 : max_len + 4]


def test_delete_history(client: httpx.Client, catalogue: list[str]) -> None:
    user = _user()
    assert client.post("/events", json={"user_id": user, "item_id": catalogue[2]}).status_code == 200
    assert client.delete(f"/users/{user}/history").json() == {"user_id": user, "deleted": True}
    assert client.get(f"/users/{user}/history").json() == {"user_id": user, "items": []}
    assert client.delete(f"/users/{user}/history").json() == {"user_id": user, "deleted": False}
    assert _recommend(client, user_id=user)["fallback"] == "popularity"


def test_writes_need_no_key_when_none_is_set(client: httpx.Client, catalogue: list[str]) -> None:
    user = _user()
    assert client.post("/events", json={"user_id": user, "item_id": catalogue[0]}).status_code == 200
    assert client.delete(f"/users/{user}/history").status_code == 200
    reload = client.post("/admin/reload")
    assert reload.status_code == 200, reload.text
    assert reload.json()["status"] == "unchanged"


def test_personalize(client: httpx.Client, catalogue: list[str]) -> None:
    history = catalogue[:6]
    answer = _recommend(client, history=history, k=5, personalize=True)
    assert len(answer["items"]) == 5
    assert set(_ids(answer)) <= set(catalogue) - set(history)
    assert all(np.isfinite([i["score"], i["retrieval_score"]]).all() for i in answer["items"])
    # one item has no next item to learn from: the plain model's answer (personalize runs the eager model, a
    # plain request the compiled one: the same items, scores within the compiled path's 1e-4)
    single = _pairs(_recommend(client, history=catalogue[:1], k=5, personalize=True))
    plain = _pairs(_recommend(client, history=catalogue[:1], k=5))
    assert [i for i, _, _ in single] == [i for i, _, _ in plain]
    np.testing.assert_allclose(np.array([s[1:] for s in single]), np.array([p[1:] for p in plain]), atol=1e-4)


def test_health_and_readiness(client: httpx.Client, bundle: Path) -> None:
    assert client.get("/healthz").json() == {"status": "alive"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready"
    assert ready["store"] == {"kind": "memory", "reachable": True, "writable": True}
    assert ready["backbone"] == "transformer"
    assert ready["ranker"] == "lgbm"
    assert ready["max_len"] == 10
    assert ready["n_items"] == len(np.load(bundle / "item_ids.npy", allow_pickle=False))
    assert ready["catalogue"] is True
    assert "path" not in ready
    assert str(bundle.resolve()) not in json.dumps(ready)
    assert ready["seqrec_version"] == importlib.metadata.version("seqrec")
    assert ready["model_version"] == json.loads((bundle / "manifest.json").read_text())["version"]


def test_metrics(client: httpx.Client, catalogue: list[str], ready: dict[str, Any]) -> None:
    _recommend(client, history=catalogue[:4])
    client.get("/healthz")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    requests = metric_samples(text, "seqrec_requests_total")
    assert requests['{method="POST",route="/recommend",status="200"}'] >= 1
    assert requests['{method="GET",route="/healthz",status="200"}'] >= 1
    latency = metric_samples(text, "seqrec_request_seconds_count")
    assert latency['{method="POST",route="/recommend"}'] >= 1
    stages = metric_samples(text, "seqrec_stage_seconds_count")
    for stage in ("encode", "search", "rerank"):
        assert stages[f'{{stage="{stage}"}}'] >= 1
    assert metric_samples(text, "seqrec_batch_size_count")[""] >= 1
    assert metric_samples(text, "seqrec_model_info") == {f'{{ranker="lgbm",version="{ready["model_version"]}"}}': 1.0}
    assert metric_samples(text, "seqrec_build_info") == {f'{{version="{importlib.metadata.version("seqrec")}"}}': 1.0}


def test_openapi_lists_the_routes(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    routes = {(path, method) for path, methods in spec["paths"].items() for method in methods}
    assert routes >= {("/recommend", "post"), ("/events", "post"), ("/users/{user_id}/history", "get"),
                      ("/users/{user_id}/history", "delete"), ("/items/{item_id}", "get"), ("/healthz", "get"),
                      ("/readyz", "get"), ("/metrics", "get"), ("/admin/reload", "post")}
    item = spec["components"]["schemas"]["RecommendedItem"]["properties"]
    assert {"item_id", "score", "retrieval_score", "rank", "title", "genres"} <= set(item)
    assert spec["info"]["version"] == importlib.metadata.version("seqrec")  # the installed release, not a literal
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()
