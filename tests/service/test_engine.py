"""The micro-batching engine in this process: batches form, each batch size is reported, and a request is
answered by the bundle its internal ids were mapped with even when a reload swaps the bundle meanwhile."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from pathlib import Path

import pytest

from service.http.engine import Engine, Overloaded
from service.system.bundle import Bundle
from service.system.loader import load_bundle
from service.system.recommend import Query, Result, recommend_batch

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served(bundle: Path) -> Bundle:
    return load_bundle(bundle)


@pytest.fixture(scope="module")
def reloaded(bundle: Path) -> Bundle:
    """Another load of the same folder: another Bundle object, as a reload makes."""
    return load_bundle(bundle)


QUERIES = [Query([1, 2, 3], k=5, candidates=20), Query([4], k=3, candidates=10, rerank=False),
           Query([7, 8, 9, 10, 11], k=8, candidates=30, exclude_seen=False)]


async def test_concurrent_requests_share_a_batch(served: Bundle) -> None:
    sizes: list[int] = []
    engine = Engine(served, max_batch=8, max_wait_ms=200, on_batch=sizes.append)
    await engine.start()
    try:
        results = await asyncio.gather(*(engine.recommend(q) for q in QUERIES))
    finally:
        await engine.stop()
    assert sizes == [3]
    for query, result, alone in zip(QUERIES, results, recommend_batch(served, QUERIES), strict=True):
        assert result.items == alone.items, query


async def test_a_request_keeps_the_bundle_it_was_mapped_with(served: Bundle, reloaded: Bundle) -> None:
    sizes: list[int] = []
    engine = Engine(served, max_batch=8, max_wait_ms=200, on_batch=sizes.append)
    await engine.start()
    try:
        before = asyncio.create_task(engine.recommend(QUERIES[0], served))
        await asyncio.sleep(0.01)  # queued; the worker waits for more
        engine.bundle = reloaded  # what a reload does
        after = asyncio.create_task(engine.recommend(QUERIES[1]))
        results: list[Result] = [await before, await after]
    finally:
        await engine.stop()
    assert results[0].bundle is served
    assert results[1].bundle is reloaded
    assert sorted(sizes) == [1, 1]  # one batch per bundle


def test_set_threads_keeps_numpy_blas_on_one_thread() -> None:
    """The ranker's features multiply in numpy: its BLAS must not keep threads spinning beside the event loop,
    not even when SEQREC_THREADS gives torch and FAISS two (the engine's inference thread calls set_threads)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from service.http.engine import set_threads

    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    if not blas:
        pytest.skip("numpy has no BLAS thread pool here")
    import faiss
    import torch

    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        with threadpool_limits(None):  # restores the BLAS pools' counts on exit
            for threads in (2, 1):
                set_threads(threads)
                assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {1}
                assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == (threads, threads)
    finally:
        torch.set_num_threads(torch_threads)
        faiss.omp_set_num_threads(faiss_threads)


async def test_a_full_queue_refuses_at_once_and_every_admitted_request_is_answered(served: Bundle) -> None:
    """Load shedding: with the model busy and ``max_queue`` requests waiting, the next one gets `Overloaded` at
    once (the route's 503), and the admitted ones are still answered, each as it would be alone."""
    release = threading.Event()
    engine = Engine(served, max_batch=1, max_queue=2)
    real = engine._run_batch

    def busy_model(bundle: Bundle, queries: list[Query]) -> list[Result]:
        release.wait(30)
        return real(bundle, queries)

    engine._run_batch = busy_model  # type: ignore[assignment]
    await engine.start()
    try:
        running = asyncio.create_task(engine.recommend(QUERIES[0]))
        await asyncio.sleep(0.1)  # the worker took it and waits in the model
        waiting = [asyncio.create_task(engine.recommend(q)) for q in QUERIES[1:]]
        await asyncio.sleep(0.05)  # both queued
        with pytest.raises(Overloaded, match="2 requests already wait"):
            await engine.recommend(QUERIES[0])
        assert engine.shed == 1
        release.set()
        results = await asyncio.gather(running, *waiting)
    finally:
        release.set()
        await engine.stop()
    for query, result in zip(QUERIES, results, strict=True):
        assert result.items == recommend_batch(served, [query])[0].items, query


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_with_two_runners_a_request_starts_while_another_batch_runs(served: Bundle, concurrency: int) -> None:
    """``concurrency`` 2: the first batch holds the model until a second batch has started beside it, which
    only a second runner can do; with one runner the second request waits for the first batch (it never
    starts while the first runs). Every answer is the one it gets alone."""
    second_started = threading.Event()
    engine = Engine(served, max_batch=8, concurrency=concurrency)
    real = engine._run_batch
    overlapped: list[bool] = []

    def model(bundle: Bundle, queries: list[Query]) -> list[Result]:
        if queries[0] is QUERIES[0]:
            overlapped.append(second_started.wait(2 if concurrency == 1 else 30))
        else:
            second_started.set()
        return real(bundle, queries)

    engine._run_batch = model  # type: ignore[assignment]
    await engine.start()
    try:
        first = asyncio.create_task(engine.recommend(QUERIES[0]))
        await asyncio.sleep(0.1)  # a runner took it and holds the model
        results = [await engine.recommend(QUERIES[1]), await first]
    finally:
        second_started.set()
        await engine.stop()
    assert overlapped == [concurrency == 2]
    assert results[0].items == recommend_batch(served, [QUERIES[1]])[0].items
    assert results[1].items == recommend_batch(served, [QUERIES[0]])[0].items


def test_concurrency_below_one_is_refused(served: Bundle) -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        Engine(served, concurrency=0)


async def test_an_overloaded_service_answers_503_with_retry_after(served: Bundle,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app (in-process ASGI, its own lifespan): the 503 says why, asks to retry, and is counted."""
    import httpx

    from service.http.app import create_app
    from service.http.settings import Settings

    async def refuse(self: Engine, query: Query, bundle: Bundle | None = None) -> Result:
        raise Overloaded("256 requests already wait for the model (SEQREC_MAX_QUEUE)")

    monkeypatch.setattr(Engine, "recommend", refuse)
    app = create_app(Settings(artifacts=served.path), bundle=served)
    transport = httpx.ASGITransport(app=app)
    local = "http://localhost"  # a key-less app answers its localhost names only (SEQREC_ALLOWED_HOSTS)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url=local) as client:
        response = await client.post("/recommend", json={"history": [served.external(1)]})
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json() == {"detail": "overloaded, retry later: 256 requests already wait for the model "
                                         "(SEQREC_MAX_QUEUE)"}
    assert "seqrec_shed_total 1.0" in metrics


def _walked(obj: object) -> bool:
    """Whether the cyclic collector's generations hold ``obj`` (frozen objects are in none of them)."""
    return any(o is obj for o in gc.get_objects())


async def test_the_served_bundle_is_frozen_out_of_the_collectors_walk_and_an_old_one_still_freed(bundle: Path) -> None:
    first = load_bundle(bundle)
    assert _walked(first)  # a fresh load: every full collection would walk it
    engine = Engine(first)
    await engine.start()
    try:
        assert not _walked(first)
        assert gc.get_freeze_count() > 0
        old, new = await engine.reload(bundle)
        assert old is first
        assert not _walked(new)
        gone = weakref.ref(first)
        was_enabled = gc.isenabled()
        gc.disable()  # reference counting alone must free the dropped bundle, frozen or not
        try:
            del first, old
            assert gone() is None
        finally:
            if was_enabled:
                gc.enable()
        assert (await engine.recommend(QUERIES[0])).items == recommend_batch(new, QUERIES[:1])[0].items
    finally:
        await engine.stop()
