"""The serving engine: a loaded bundle, the two-stage recommendation, micro-batching, hot reload.

A request's history (external ids, oldest first) is mapped to internal ids (unknown ids are
reported and ignored), cut to the model's last ``max_len`` items and queued. One worker
collects up to ``max_batch`` queued requests (waiting at most ``max_wait_ms`` for more), runs
them as one forward pass in ``torch.inference_mode`` on a single inference thread, searches the
FAISS index with the history excluded, computes the ranker's features with the same code as
the offline evaluation (`ranker.features.compute_features`) and returns the top k.

A bundle is a retriever artifact folder (`retriever.artifact`), optionally with its ranker
(`BUNDLE/ranker/`), its catalogue and popularity counts. ``ARTIFACTS/current`` (a symlink or
a folder) names the bundle to serve; ``reload`` validates a new one (checksums, shapes, a smoke
query) before it replaces the old one, and batches already running keep the bundle they began with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from ranker.artifact import RankerArtifact, RankerError, load_ranker, unit_item_vectors
from ranker.features import TorchTables, compute_features
from ranker.mining import padded_slices
from retriever.artifact import CATALOGUE, POPULARITY, ArtifactError, RetrieverArtifact, load_artifact
from retriever.index import search

log = logging.getLogger(__name__)

CURRENT = "current"
METADATA_COLUMNS = ("title", "year", "genres", "attributes")


class BundleError(Exception):
    """A bundle that cannot be served; the message says which file and why."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    artifact: RetrieverArtifact
    ranker: RankerArtifact | None
    tables: TorchTables | None
    vectors: torch.Tensor  # (n_items + 1, D) unit item vectors, row 0 = 0
    index_of: dict[str, int]  # external id -> internal id (1..n_items)
    metadata: list[dict[str, Any]]  # row r = internal id r + 1; empty dicts without a catalogue
    popular: np.ndarray  # internal ids, most popular first (the cold-start answer)
    popularity: np.ndarray  # (n_items + 1,) training counts (or the ranker's popularity), the fallback's score
    loaded_at: float = field(default_factory=time.time)
    # For `find`: ids, lowercase titles and popularity ranks in popularity order, computed once at load.
    _by_popularity: list[tuple[int, str, str]] = field(init=False, repr=False, compare=False)
    popularity_rank: np.ndarray = field(init=False, repr=False, compare=False)  # (n_items + 1,), 1 = most popular

    def __post_init__(self) -> None:
        order = self.popular.tolist()
        rows = [(i, self.external(i), str(self.metadata[i - 1].get("title", "")).casefold()) for i in order]
        rank = np.zeros(self.n_items + 1, dtype=np.int64)
        rank[self.popular] = np.arange(1, len(order) + 1)
        object.__setattr__(self, "_by_popularity", rows)
        object.__setattr__(self, "popularity_rank", rank)

    @property
    def version(self) -> str:
        return str(self.artifact.manifest["version"])

    @property
    def max_len(self) -> int:
        return self.artifact.max_len

    @property
    def n_items(self) -> int:
        return self.artifact.n_items

    def external(self, internal: int) -> str:
        return str(self.artifact.item_ids[internal - 1])

    def find(self, query: str, limit: int) -> tuple[list[int], bool]:
        """Internal ids matching ``query``, at most ``limit``, and whether more match: the item whose id is
        ``query`` first, then, most popular first, items whose id starts with it or whose title contains it
        (case-insensitively). An empty query lists the most popular items."""
        query = query.strip()
        exact = self.index_of.get(query)
        found = [] if exact is None else [exact]
        needle = query.casefold()
        for internal, item_id, title in self._by_popularity:
            if internal != exact and (item_id.startswith(query) or needle in title):
                found.append(internal)
                if len(found) > limit:
                    break
        return found[:limit], len(found) > limit

    def describe(self) -> dict[str, Any]:
        manifest = self.artifact.manifest
        return {
            "model_version": self.version,
            "path": str(self.path),
            "backbone": manifest.get("backbone"),
            "n_items": self.n_items,
            "max_len": self.max_len,
            "ranker": None if self.ranker is None else self.ranker.kind,
            "catalogue": bool(self.metadata and any(self.metadata)),
            "created_at": manifest.get("created_at"),
        }


def resolve_bundle(artifacts: Path) -> Path:
    """``ARTIFACTS/current`` when it exists, else ``ARTIFACTS`` itself when it is a bundle."""
    artifacts = Path(artifacts)
    current = artifacts / CURRENT
    if current.exists():
        return current.resolve()
    if (artifacts / "manifest.json").is_file():
        return artifacts.resolve()
    if not artifacts.exists():
        raise BundleError(f"{artifacts}: no such folder (set SEQREC_ARTIFACTS or --artifacts)")
    raise BundleError(f"{artifacts}: neither a bundle (no manifest.json) nor an artifacts folder with `{CURRENT}`")


def load_bundle(path: Path) -> Bundle:
    """Load and validate a bundle: checksums, shapes, the ranker's lineage, then a smoke query."""
    path = Path(path)
    try:
        artifact = load_artifact(path)
        ranker = load_ranker(path, artifact.manifest)
    except (ArtifactError, RankerError) as err:
        raise BundleError(str(err)) from None
    n_items = artifact.n_items
    with torch.inference_mode():
        vectors = unit_item_vectors(artifact.model.item_vectors().detach())
    if vectors.shape[0] != n_items + 1:
        raise BundleError(f"{path}: the model scores {vectors.shape[0] - 1} items but item_ids.npy lists {n_items}")
    ids = [str(i) for i in artifact.item_ids.tolist()]
    index_of = {item: row + 1 for row, item in enumerate(ids)}
    if len(index_of) != n_items:
        raise BundleError(f"{path}: item_ids.npy holds duplicate ids")
    bundle = Bundle(path, artifact, ranker, None if ranker is None else ranker.tables.torch(), vectors, index_of,
                    _metadata(path, ids), *_popular(path, artifact, ranker))
    _smoke(bundle)
    return bundle


def _metadata(path: Path, ids: list[str]) -> list[dict[str, Any]]:
    file = path / CATALOGUE
    if not file.is_file():
        return [{} for _ in ids]
    try:
        table = pq.read_table(file)
    except (OSError, ValueError) as err:
        raise BundleError(f"{file}: unreadable catalogue: {err}") from None
    columns = [c for c in METADATA_COLUMNS if c in table.column_names]
    if "item_id" not in table.column_names:
        raise BundleError(f"{file}: the catalogue has no item_id column")
    rows = {str(r["item_id"]): r for r in table.select(["item_id", *columns]).to_pylist()}
    out = []
    for item in ids:
        row = rows.get(item, {})
        meta: dict[str, Any] = {}
        for column in columns:
            value = row.get(column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if column in ("genres", "attributes"):
                meta[column] = [str(v) for v in value]
            elif column == "year":
                meta[column] = int(value)
            else:
                meta[column] = str(value)
        out.append(meta)
    return out


def _popular(path: Path, artifact: RetrieverArtifact, ranker: RankerArtifact | None) -> tuple[np.ndarray, np.ndarray]:
    n_items = artifact.n_items
    file = path / POPULARITY
    if file.is_file():
        counts = np.load(file, allow_pickle=False).astype(np.float64)
    elif ranker is not None:
        counts = ranker.tables.popularity.astype(np.float64)
    else:
        counts = np.zeros(n_items + 1)
    if counts.shape != (n_items + 1,):
        raise BundleError(f"{file}: popularity has shape {counts.shape}; expected ({n_items + 1},)")
    return np.argsort(-counts[1:], kind="stable") + 1, counts  # ties: catalogue order


def _smoke(bundle: Bundle) -> None:
    """A real query through every stage; a bundle that cannot answer it is refused."""
    history = list(range(1, min(bundle.n_items, 3) + 1))
    try:
        (result,) = recommend_batch(bundle, [Query(history, k=5, candidates=20, exclude_seen=True, rerank=True)])
    except Exception as err:  # a bundle that crashes on a plain query must never replace a working one
        raise BundleError(f"{bundle.path}: smoke query failed: {type(err).__name__}: {err}") from None
    expected = min(5, bundle.n_items - len(history))
    if len(result.items) != expected or not all(math.isfinite(s) for _, s, r in result.items for s in (s, r)):
        raise BundleError(f"{bundle.path}: smoke query returned {len(result.items)} items (expected {expected}) "
                          "or non-finite scores")


@dataclass(frozen=True)
class Query:
    history: list[int]  # internal ids, oldest first, already cut to max_len
    k: int
    candidates: int
    exclude_seen: bool = True
    rerank: bool = True
    personalize: bool = False
    exclude: tuple[int, ...] = ()  # further internal ids never to return (the rest of a long history)


@dataclass
class Result:
    items: list[tuple[int, float, float]]  # (internal id, score, retrieval score), best first
    bundle: Bundle  # the bundle that answered (its ids and metadata describe the items)
    reranked: bool
    timing_ms: dict[str, float]

    @property
    def version(self) -> str:
        return self.bundle.version


def recommend_batch(bundle: Bundle, queries: Sequence[Query], *, beta: float = 1e-5, steps: int = 1) -> list[Result]:
    """Retrieve, rerank and cut to k for a batch of queries in one forward pass.

    Queries with ``personalize`` get PCRec-simple user vectors (``steps`` gradient steps of rate
    ``beta`` on their own history, on a private copy of the weights), one user at a time.
    """
    model = bundle.artifact.model
    t0 = time.perf_counter()
    lengths = np.array([len(q.history) for q in queries])
    flat = np.fromiter((i for q in queries for i in q.history), dtype=np.int64, count=int(lengths.sum()))
    ends = np.cumsum(lengths)
    history = torch.from_numpy(padded_slices(flat, ends - lengths, ends, bundle.max_len))
    plain = [i for i, q in enumerate(queries) if not q.personalize]
    user = torch.zeros(len(queries), bundle.vectors.shape[1])  # a normal tensor: personalize writes into it too
    if plain:
        with torch.inference_mode():
            vectors = model.user_vectors(history[plain]).float()
        user[plain] = vectors
    special = [i for i, q in enumerate(queries) if q.personalize]
    if special:
        user[special] = model.personalize(history[special], beta=beta, steps=steps).detach().float()
    user = torch.nn.functional.normalize(user, dim=-1)
    t1 = time.perf_counter()
    depth = min(max(max(q.candidates, q.k) for q in queries), bundle.n_items)
    exclude = [np.array(sorted({*(q.history if q.exclude_seen else ()), *q.exclude}), dtype=np.int64) - 1
               for q in queries]
    assert bundle.artifact.index is not None  # load_bundle always loads it
    scores, rows = search(bundle.artifact.index, user.numpy(), depth, exclude=exclude)
    candidates = np.where(rows >= 0, rows + 1, 0)
    for i, q in enumerate(queries):  # each request keeps its own retrieval depth
        n = max(q.candidates, q.k)
        candidates[i, n:] = 0
        scores[i, n:] = -np.inf
    t2 = time.perf_counter()
    final = scores.astype(np.float64)
    rerank = [i for i, q in enumerate(queries) if q.rerank and bundle.ranker is not None]
    if rerank:
        assert bundle.ranker is not None
        assert bundle.tables is not None
        with torch.inference_mode():
            cand = torch.from_numpy(candidates[rerank])
            batch = compute_features(bundle.tables, bundle.vectors, history[rerank], user[rerank], cand,
                                     torch.from_numpy(np.where(cand.numpy() > 0, scores[rerank], 0.0)))
            final[rerank] = bundle.ranker.ranker.score(batch).double().numpy()
    t3 = time.perf_counter()
    timing = {"encode": 1000 * (t1 - t0), "search": 1000 * (t2 - t1), "rerank": 1000 * (t3 - t2)}
    out = []
    reranked = set(rerank)
    for i, q in enumerate(queries):
        valid = candidates[i] > 0
        order = np.flatnonzero(valid)
        # best first; ties keep the retrieval order (stable), so the order never depends on the batch
        order = order[np.argsort(-final[i, order], kind="stable")][: q.k]
        items = [(int(candidates[i, j]), float(final[i, j]), float(scores[i, j])) for j in order]
        out.append(Result(items, bundle, i in reranked, timing))
    return out


_Pending = tuple[Query, Bundle, asyncio.Future[Result]]  # a queued request and the bundle its ids belong to


class Engine:
    """The served bundle, the micro-batching worker and hot reload."""

    def __init__(self, bundle: Bundle, *, max_batch: int = 32, max_wait_ms: float = 2.0, threads: int = 1,
                 personalize_beta: float = 1e-5, personalize_steps: int = 1,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.bundle = bundle
        self.on_batch = on_batch  # called with each answered batch's size (the /metrics histogram)
        self._run_batch = functools.partial(recommend_batch, beta=personalize_beta, steps=personalize_steps)
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.threads = threads
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._inference = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqrec-inference",
                                             initializer=set_threads, initargs=(threads,))
        self._reload_lock = asyncio.Lock()
        self.batches = 0
        self.batch_sizes: list[int] = []  # recent batch sizes, for /metrics

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="seqrec-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._inference.shutdown(wait=True, cancel_futures=True)

    async def recommend(self, query: Query, bundle: Bundle | None = None) -> Result:
        """Answer ``query`` with ``bundle`` (default: the served one), the bundle whose catalogue its internal
        ids come from, even when a reload swaps in another bundle (maybe another catalogue) meanwhile."""
        if self._queue is None:
            raise RuntimeError("engine not started")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((query, bundle or self.bundle, future))
        return await future

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            by_bundle: dict[int, list[_Pending]] = {}  # one batch per bundle: two only around a reload
            for pending in batch:
                if not pending[2].cancelled():  # clients that went away
                    by_bundle.setdefault(id(pending[1]), []).append(pending)
            for group in by_bundle.values():
                await self._answer(loop, group)

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
            new = await asyncio.to_thread(_load_with_threads, path, self.threads)
            old, self.bundle = self.bundle, new
            return old, new


def set_threads(threads: int) -> None:
    """Threads of the calling thread's torch ops and FAISS searches (OpenMP's count is per calling thread)."""
    import faiss

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)


def _load_with_threads(path: Path, threads: int) -> Bundle:
    set_threads(threads)
    return load_bundle(path)
