"""The serving hot path: the stored-user vector cache (hit, miss, stale, dropped), the /recommend body written
without pydantic still matching its schema, and the adaptive batcher answering a lone request at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from service.http.engine import Engine
from service.http.schemas import RecommendResponse
from service.system.bundle import Bundle
from service.system.cache import UserVectors
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch
from tests.service.support import Server


@pytest.fixture(scope="module")
def served(bundle: Path) -> Bundle:
    return load_bundle(bundle)


def test_the_cache_keeps_a_user_vector_per_history() -> None:
    cache = UserVectors(capacity=2)
    cache.put("a", [1, 2], torch.ones(3))
    assert torch.equal(cache.get("a", [1, 2]), torch.ones(3))  # type: ignore[arg-type]
    assert cache.get("a", [1, 2, 3]) is None  # the history moved on: stale
    assert cache.get("b", [1, 2]) is None
    cache.put("b", [1], torch.zeros(3))
    cache.get("a", [1, 2])  # a is now the most recent
    cache.put("c", [1], torch.zeros(3))  # b goes
    assert cache.get("b", [1]) is None
    assert cache.get("a", [1, 2]) is not None
    cache.drop("a")
    assert cache.get("a", [1, 2]) is None
    assert (cache.hits, len(cache)) == (3, 1)


def test_a_hit_answers_as_the_encoder_does(served: Bundle) -> None:
    user = f"u-{uuid.uuid4().hex}"
    plain = Query([3, 5, 8, 13], k=5, candidates=20)
    stored = Query(plain.history, k=5, candidates=20, user=user)
    hits = served.user_cache.hits
    (first,) = recommend_batch(served, [stored])  # miss: encodes and stores
    second, _ = recommend_batch(served, [stored, Query([1, 2], k=5, candidates=20)])  # hit, in another batch
    (reference,) = recommend_batch(served, [plain])
    assert served.user_cache.hits == hits + 1
    assert first.items == second.items == reference.items
    moved = Query([*plain.history, 21], k=5, candidates=20, user=user)  # an event was appended
    (after,) = recommend_batch(served, [moved])
    (fresh,) = recommend_batch(served, [Query(moved.history, k=5, candidates=20)])
    assert served.user_cache.hits == hits + 1
    assert after.items == fresh.items


def test_a_lone_request_does_not_wait(served: Bundle) -> None:
    """No fixed wait by default: a lone request is answered without waiting for company (a 500 ms
    max_wait_ms, set explicitly, is the contrast)."""

    async def waited(**options: float) -> float:
        engine = Engine(served, max_batch=8, **options)  # type: ignore[arg-type]
        await engine.start()
        try:
            await engine.recommend(Query([1, 2, 3], k=5, candidates=20))
            t = time.perf_counter()
            result = await engine.recommend(Query([1, 2, 3], k=5, candidates=20))
            return 1000 * (time.perf_counter() - t) - sum(result.timing_ms.values())
        finally:
            await engine.stop()

    assert asyncio.run(waited()) < 250  # the hop to the inference thread, even on a busy machine
    assert asyncio.run(waited(max_wait_ms=500)) >= 490


@pytest.fixture(scope="module")
def client(api: Server) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


def test_the_body_matches_its_schema_and_the_cache_follows_events(client: httpx.Client, served: Bundle) -> None:
    user = f"u-{uuid.uuid4().hex}"
    items = [served.external(i) for i in (2, 4, 6)]
    assert client.post("/events", json={"events": [{"user_id": user, "item_id": i} for i in items]}).status_code == 200
    first = client.post("/recommend", json={"user_id": user, "k": 5})
    assert first.headers["content-type"] == "application/json"
    body = first.json()
    assert RecommendResponse.model_validate(body).model_dump(mode="json", exclude_none=False)["fallback"] is None
    assert all(value is not None for item in body["items"] for value in item.values())
    again = client.post("/recommend", json={"user_id": user, "k": 5}).json()  # a hit
    assert again["items"] == body["items"]
    client.post("/events", json={"user_id": user, "item_id": served.external(8)})
    moved = client.post("/recommend", json={"user_id": user, "k": 5}).json()
    given = client.post("/recommend", json={"history": [*items, served.external(8)], "k": 5}).json()
    assert moved["history_used"] == 4
    assert [i["item_id"] for i in moved["items"]] == [i["item_id"] for i in given["items"]]
