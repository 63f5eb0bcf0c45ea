"""A `/recommend` request answered without HTTP (`service.http.answer.answer`), and the one answer that needs the
model's contract: ``personalize`` on a bidirectional encoder is a field error, refused before anything is
queued, so it never fails the batch it would have joined."""

from __future__ import annotations

import inspect
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.http.answer import ITEM_FIELDS, _body, _item_body, answer
from service.http.app import create_app
from service.http.engine import Engine
from service.http.metrics import Metrics
from service.http.schemas import RecommendedItem, RecommendRequest, RecommendResponse
from service.http.settings import Settings
from service.http.store import Event, HistoryStore, MemoryStore
from service.system.bundle import Bundle
from service.system.loader import METADATA_COLUMNS, load_bundle
from service.system.recommend import NeedsCausalModel, Query, recommend_batch

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served(bundle: Path) -> Bundle:
    return load_bundle(bundle)


@pytest.fixture
def bidirectional(bundle: Path) -> Bundle:
    """A fresh load whose encoder says it reads the whole window, as BERT4Rec's does."""
    loaded = load_bundle(bundle)
    loaded.artifact.model.encoder.causal = False
    return loaded


@pytest.fixture
async def engine(served: Bundle) -> AsyncIterator[Engine]:
    engine = Engine(served, max_batch=8, max_wait_ms=1)
    await engine.start()
    yield engine
    await engine.stop()


def test_the_body_builders_take_the_response_models_fields() -> None:
    """The body is a plain dict written by orjson; its keys come from the response models, whose fields the
    builders take one for one, and the catalogue's fields are the bundle's metadata columns."""
    assert tuple(inspect.signature(_body).parameters) == tuple(RecommendResponse.model_fields)
    assert tuple(inspect.signature(_item_body).parameters) == (*ITEM_FIELDS, "more")
    assert _item_body("a", 1.0, 0.5, 1, {"title": "t"}) == {"item_id": "a", "score": 1.0, "retrieval_score": 0.5,
                                                            "rank": 1, "title": "t"}
    catalogue = tuple(name for name, f in RecommendedItem.model_fields.items() if not f.is_required())
    assert (*ITEM_FIELDS, *catalogue) == tuple(RecommendedItem.model_fields)
    assert catalogue == METADATA_COLUMNS


def test_the_body_has_the_response_models_keys_in_order() -> None:
    body = _body([], "v", False, [], None, 0, {})
    assert tuple(body) == tuple(RecommendResponse.model_fields)


async def test_answer_maps_ids_and_runs_both_stages(served: Bundle, engine: Engine) -> None:
    history = [served.external(i) for i in (3, 1, 4)]
    body = RecommendRequest(history=[*history, "no-such-item"], k=5)
    out = await answer(body, engine, MemoryStore(), Metrics())
    assert served.ranker is not None
    # no `candidates` in the body: the depth the ranker was trained at
    (alone,) = recommend_batch(served, [Query([3, 1, 4], k=5, candidates=served.ranker.depth)])
    assert [item["item_id"] for item in out["items"]] == [served.external(i) for i, _, _ in alone.items]
    assert [item["rank"] for item in out["items"]] == [1, 2, 3, 4, 5]
    assert out["unknown_items"] == ["no-such-item"]
    assert out["history_used"] == 3
    assert out["fallback"] is None
    assert out["reranked"] is True
    assert out["model_version"] == served.version


async def test_answer_reads_the_stored_history(served: Bundle, engine: Engine) -> None:
    store = MemoryStore()
    await store.append("u1", [Event(served.external(5)), Event(served.external(6))], served.max_len)
    stored = await answer(RecommendRequest(user_id="u1", k=4), engine, store, Metrics())
    given = await answer(RecommendRequest(history=[served.external(5), served.external(6)], k=4), engine,
                         MemoryStore(), Metrics())
    assert stored["items"] == given["items"]
    assert stored["history_used"] == 2


async def test_an_empty_history_gets_the_most_popular_items(served: Bundle, engine: Engine) -> None:
    metrics = Metrics()
    out = await answer(RecommendRequest(history=["no-such-item"], k=3), engine, MemoryStore(), metrics)
    assert [item["item_id"] for item in out["items"]] == [served.external(int(i)) for i in served.popular[:3]]
    assert out["fallback"] == "popularity"
    assert out["history_used"] == 0
    assert metrics.registry.get_sample_value("seqrec_fallbacks_total", {"kind": "popularity"}) == 1
    assert engine.batches == 0


async def test_personalize_needs_a_causal_model(bidirectional: Bundle) -> None:
    engine = Engine(bidirectional, max_batch=8, max_wait_ms=1)
    await engine.start()
    try:
        with pytest.raises(NeedsCausalModel, match="needs a causal model; this bundle's backbone is transformer"):
            await answer(RecommendRequest(history=[bidirectional.external(1)], personalize=True), engine,
                         MemoryStore(), Metrics())
    finally:
        await engine.stop()
    assert engine.batches == 0


async def test_personalize_on_a_bidirectional_model_is_a_422(bidirectional: Bundle) -> None:
    """In-process ASGI (the patched bundle lives in this process), with the app's own lifespan."""
    app = create_app(Settings(artifacts=bidirectional.path), bundle=bidirectional)
    transport = httpx.ASGITransport(app=app)
    local = "http://localhost"  # a key-less app answers its localhost names only (SEQREC_ALLOWED_HOSTS)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url=local) as client:
        response = await client.post("/recommend", json={"history": [bidirectional.external(1)], "personalize": True})
        plain = await client.post("/recommend", json={"history": [bidirectional.external(1)]})
    assert response.status_code == 422
    assert response.json() == {
        "detail": "personalize: needs a causal model; this bundle's backbone is transformer",
        "errors": [{"field": "personalize", "message": "needs a causal model; this bundle's backbone is transformer",
                    "type": "value_error"}],
    }
    assert plain.status_code == 200


async def test_a_stored_user_never_gets_back_an_item_that_left_the_window(served: Bundle, engine: Engine,
                                                                          store: HistoryStore) -> None:
    """The items a stored user would be recommended are then sent as older events (late, timestamps before the
    window's): they leave the window at once, the window and so the model's input stay the same, and still none
    of them comes back, on either store. Without the seen set the answer would be those very items."""
    k, max_len = 20, served.max_len
    window = [served.external(i) for i in range(1, max_len + 1)]
    await store.append("u", [Event(i, 100.0 + t) for t, i in enumerate(window)], max_len)
    body = RecommendRequest(user_id="u", k=k)
    before = [item["item_id"] for item in (await answer(body, engine, store, Metrics()))["items"]]
    assert len(before) == k
    assert not set(before) & set(window)

    await store.append("u", [Event(i, float(t)) for t, i in enumerate(before)], max_len)
    assert [e.item_id for e in await store.history("u")] == window
    after = [item["item_id"] for item in (await answer(body, engine, store, Metrics()))["items"]]
    assert len(after) == k
    assert not set(after) & {*before, *window}
    # the request may still ask for seen items
    unfiltered = await answer(RecommendRequest(user_id="u", k=k, exclude_seen=False), engine, store, Metrics())
    assert set(before) & {item["item_id"] for item in unfiltered["items"]}


async def test_the_popularity_answer_leaves_out_a_stored_users_seen_items(served: Bundle, engine: Engine,
                                                                         store: HistoryStore) -> None:
    """A user whose window holds only ids the catalogue does not know (/events stores them) gets the popularity
    answer; the known items they saw before, the most popular ones here, stay out of it, as they would of the
    model's answer."""
    k, max_len = 10, served.max_len
    seen = [served.external(i) for i in served.popular[:k].tolist()]
    await store.append("p", [Event(i, float(t)) for t, i in enumerate(seen)], max_len)
    await store.append("p", [Event(f"not-in-catalogue-{t}", 100.0 + t) for t in range(max_len)], max_len)
    answered = await answer(RecommendRequest(user_id="p", k=k), engine, store, Metrics())
    assert answered["fallback"] == "popularity"
    items = [item["item_id"] for item in answered["items"]]
    assert len(items) == k
    assert not set(items) & set(seen)
    assert items == [served.external(i) for i in served.popular[k:2 * k].tolist()]
    unfiltered = await answer(RecommendRequest(user_id="p", k=k, exclude_seen=False), engine, store, Metrics())
    assert [item["item_id"] for item in unfiltered["items"]] == seen


def _with_policy(bundle: Path, out: Path, repeats: str | None) -> Path:
    """A copy of ``bundle`` whose manifest says ``repeats`` (None: no policy at all, as before it existed)."""
    shutil.copytree(bundle, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("repeats", None)
    if repeats is not None:
        manifest["repeats"] = repeats
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize(("repeats", "excluded"), [("exclude", True), ("allow", False), (None, True)])
async def test_exclude_seen_defaults_to_the_bundles_repeat_policy(bundle: Path, tmp_path: Path, repeats: str | None,
                                                                  excluded: bool) -> None:
    loaded = load_bundle(_with_policy(bundle, tmp_path / "bundle", repeats))
    assert loaded.exclude_seen is excluded
    assert loaded.describe()["repeats"] == (repeats or "exclude")  # an old bundle behaves as exclude
    engine = Engine(loaded, max_batch=8, max_wait_ms=1)
    await engine.start()
    try:
        history = [loaded.external(i) for i in (3, 1, 4)]

        async def top(**override: bool) -> list[str]:
            body = RecommendRequest(history=history, k=loaded.n_items, **override)
            return [item["item_id"] for item in (await answer(body, engine, MemoryStore(), Metrics()))["items"]]

        default = await top()
        assert bool(set(default) & set(history)) is not excluded  # every item is asked for: history ones too
        assert default == await top(exclude_seen=excluded)
        assert bool(set(await top(exclude_seen=not excluded)) & set(history)) is excluded  # a request overrides
    finally:
        await engine.stop()
