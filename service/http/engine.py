"""The micro-batching engine: the served bundle, its inference threads, hot reload.

Adaptive micro-batching: a runner takes every request queued (up to ``max_batch``) and answers them
with one `service.system.recommend.recommend_batch` call in ``torch.inference_mode`` on an inference thread of
its own. An idle runner answers a lone request at once; requests that arrive while every runner is busy
pile up and form the next batch, so batches grow with the load and never wait for it. With
``concurrency`` 2 (or more) a request that arrives while one batch runs starts at once on a second
runner instead of waiting for it: ONNX Runtime, FAISS, the compiled trees and numpy's larger operations
leave the GIL while they compute, so two batches share two cores. A request's answer does not depend on
which batch it rode in (`service.system.recommend`), so neither does it depend on the runner. ``max_wait_ms`` (default
0) adds a fixed wait for more requests, for when larger batches pay more than the wait costs. Past
``max_queue`` waiting requests a new one is refused at once (`Overloaded`, a 503 with Retry-After): under
overload a queue that only grows answers everybody too late.

``reload`` validates a new bundle before it replaces the old one, and a request keeps the bundle its
internal ids were mapped with, even when a reload swaps in another meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from service.system.bundle import Bundle
from service.system.catalog import load_served
from service.system.loader import Inference
from service.system.recommend import Query, Result, recommend_batch

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """The queue already holds ``max_queue`` requests: this one is refused at once (the route answers 503)."""


_Pending = tuple[Query, Bundle, asyncio.Future[Result]]  # a queued request and the bundle its ids belong to


class Engine:
    """The served bundle, the micro-batching runners and hot reload."""

    def __init__(self, bundle: Bundle, *, max_batch: int = 32, max_wait_ms: float = 0.0, max_queue: int = 256,
                 threads: int = 1, concurrency: int = 1,
                 personalize_beta: float = 1e-5, personalize_steps: int = 1,
                 on_batch: Callable[[int], None] | None = None, inference: Inference = "auto") -> None:
        self.bundle = bundle
        self.on_batch = on_batch  # called with each answered batch's size (the /metrics histogram)
        self._run_batch = functools.partial(recommend_batch, beta=personalize_beta, steps=personalize_steps)
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.shed = 0  # requests refused because the queue was full
        self.threads = threads
        self.inference: Inference = inference  # how reloaded bundles run (service.system.loader.load_bundle)
        self._queue: asyncio.Queue[_Pending] | None = None
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self._runners: list[asyncio.Task[None]] = []
        self._inference = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="seqrec-inference",
                                             initializer=set_threads, initargs=(threads,))
        self._reload_lock = asyncio.Lock()
        self.batches = 0
        self.batch_sizes: list[int] = []  # recent batch sizes, for /metrics

    async def start(self) -> None:
        settle_heap()
        self._queue = asyncio.Queue()
        self._runners = [asyncio.create_task(self._run(), name=f"seqrec-batcher-{i}") for i in range(self.concurrency)]

    async def stop(self) -> None:
        for runner in self._runners:
            runner.cancel()
        for runner in self._runners:
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        self._inference.shutdown(wait=True, cancel_futures=True)

    async def recommend(self, query: Query, bundle: Bundle | None = None) -> Result:
        """Answer ``query`` with ``bundle`` (default: the served one), the bundle whose catalogue its internal
        ids come from, even when a reload swaps in another bundle (maybe another catalogue) meanwhile."""
        if self._queue is None:
            raise RuntimeError("engine not started")
        if self._queue.qsize() >= self.max_queue:  # shed load: an answer later than any client waits is no use
            self.shed += 1
            raise Overloaded(f"{self._queue.qsize()} requests already wait for the model (SEQREC_MAX_QUEUE)")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((query, bundle or self.bundle, future))
        return await future

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            await self._fill(loop, batch)
            by_bundle: dict[int, list[_Pending]] = {}  # one batch per bundle: two only around a reload
            for pending in batch:
                if not pending[2].cancelled():  # clients that went away
                    by_bundle.setdefault(id(pending[1]), []).append(pending)
            for group in by_bundle.values():
                await self._answer(loop, group)

    async def _fill(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        """Add what is queued (what piled up while the last batch ran); wait for more only with max_wait."""
        assert self._queue is not None
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                return

    async def _answer(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        bundle = batch[0][1]
        try:
            results = await loop.run_in_executor(self._inference, self._run_batch, bundle, [q for q, _, _ in batch])
        except Exception as err:
            log.exception("inference failed for a batch of %d", len(batch))
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        self.batches += 1
        self.batch_sizes.append(len(batch))
        del self.batch_sizes[:-1000]
        if self.on_batch is not None:
            self.on_batch(len(batch))
        for (_, _, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def reload(self, path: Path) -> tuple[Bundle, Bundle]:
        """Load and validate ``path``; swap it in only when it passes. Returns (old, new)."""
        async with self._reload_lock:
            new = await asyncio.to_thread(_load_with_threads, path, self.threads, self.inference)
            old, self.bundle = self.bundle, new
            settle_heap()
            return old, new


    async def update(self, change: Callable[[Bundle], Bundle]) -> tuple[Bundle, Bundle]:
        """Swap in ``change(served bundle)`` (a catalogue change), serialised with reloads. Returns (old, new)."""
        async with self._reload_lock:
            new = await asyncio.to_thread(change, self.bundle)
            old, self.bundle = self.bundle, new
            return old, new


def settle_heap() -> None:
    """Collect what loading left behind, then freeze what survives (`gc.freeze`) out of the collector's sight.

    The loaded bundle, the libraries and their caches are hundreds of thousands of objects that live as long as
    the process. Python's full (oldest-generation) collection walks every one of them, holding the GIL: on the
    Beauty bundle about 200 ms, and every request in flight waited for it (p99 at 100 r/s 99.6 and 146.4 ms,
    7.7-9.7 with the heap frozen; docs/results/serve/gc-freeze/). Frozen objects are never walked, so a full
    collection only sees what requests allocated since. Called once before the first request and after each
    reload (an old bundle dropped later is freed by reference counting; it holds no reference cycles), at the
    price of one collection then.
    """
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug("heap settled: %d objects frozen in %.0f ms", gc.get_freeze_count(),
              1000 * (time.perf_counter() - started))


def set_threads(threads: int) -> None:
    """Threads of the calling thread's torch ops and FAISS searches (OpenMP's count is per calling thread); numpy's
    BLAS (process-wide) always gets one.

    The ranker's features multiply small matrices in numpy, per request. BLAS's default of one thread per core
    spun against the event loop and the other workers (py-spy: a 0.15 ms product took ~3 ms), and so did any
    second thread: OpenBLAS's threads busy-wait between calls in a pool of their own, which OMP_WAIT_POLICY
    does not reach. With ``SEQREC_THREADS=2`` the server spent 71 ms of CPU per request at 10 r/s with BLAS on
    two threads, 4.5 ms with it on one (docs/results/serve/threads-2-before/ and threads-2/)."""
    import faiss
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    threadpool_limits(1, user_api="blas")


def _load_with_threads(path: Path, threads: int, inference: Inference) -> Bundle:
    set_threads(threads)
    return load_served(path, inference=inference, threads=threads)
