"""The micro-batching engine in this process: batches form, each batch size is reported, and a request is
answered by the bundle its internal ids were mapped with even when a reload swaps the bundle meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.bundle import Bundle, load_bundle
from service.engine import Engine
from service.recommend import Query, Result, recommend_batch

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
        results: list[Result[Bundle]] = [await before, await after]
    finally:
        await engine.stop()
    assert results[0].bundle is served
    assert results[1].bundle is reloaded
    assert sorted(sizes) == [1, 1]  # one batch per bundle


def test_set_threads_caps_numpy_blas_too() -> None:
    """The ranker's features multiply in numpy: its BLAS must not keep a thread per core spinning beside the
    event loop (the engine's inference thread calls set_threads with SEQREC_THREADS)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from service.engine import set_threads

    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    if not blas:
        pytest.skip("numpy has no BLAS thread pool here")
    import faiss
    import torch

    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        with threadpool_limits(None):  # restores the BLAS pools' counts on exit
            set_threads(1)
            assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {1}
    finally:
        torch.set_num_threads(torch_threads)
        faiss.omp_set_num_threads(faiss_threads)
