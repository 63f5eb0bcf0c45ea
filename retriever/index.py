"""FAISS export and search layer for item vectors.

Item vectors are stored one per index row: row ``r`` of the index is row ``r`` of the matrix handed to
:func:`build_index`, so callers keep their own row <-> item-id mapping and this module never sees ids.
Every index uses the inner-product metric; callers L2-normalise first (:func:`normalize`) when they want
cosine similarity.

Three structures are offered (:class:`IndexSpec`):

* ``flat``: exact search, no training, the default for catalogues up to a few hundred thousand items;
* ``hnsw``: a graph index, CPU only, fast approximate search for big catalogues;
* ``ivf``: inverted lists over k-means cells, optionally product-quantised (``pq_m``) to save memory,
  and the structure that runs on GPU.

GPU support is optional: the CPU-only ``faiss-cpu`` wheel lacks the GPU API entirely, so every GPU call is
guarded and the code falls back to CPU.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, cast, get_args

import faiss
import numpy as np

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw", "ivf"]
_KINDS: tuple[str, ...] = get_args(IndexKind)

# faiss k-means warns below 39 training points per centroid and its clusters get noisy; the default nlist
# respects that floor.
_MIN_POINTS_PER_CENTROID = 39
_PQ_BITS = 8
# Above this many items exact search stops being "a few ms per batch" on CPU (see spec_for_catalogue).
_FLAT_MAX_ITEMS = 200_000


@dataclass(frozen=True)
class IndexSpec:
    """How to build and search an index; serialisable with :meth:`to_dict` / :meth:`from_dict`.

    ``nlist=None`` picks about ``4 * sqrt(n)`` lists, clipped to ``[1, n // 39]``. ``pq_m=None`` stores
    full vectors in the lists (IVF-Flat); otherwise IVF-PQ with ``pq_m`` sub-quantizers of 8 bits each,
    which needs ``d % pq_m == 0`` and at least 256 training vectors.

    ``gpu_shard`` only matters when the index is loaded onto several GPUs: False puts a full copy on
    each (faiss ``IndexReplicas``: queries spread over the GPUs, for throughput), True splits the
    vectors across them (``IndexShards``: each GPU holds 1/n of the catalogue and every query asks
    all of them, for catalogues too big for one GPU's memory).
    """

    kind: IndexKind = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int | None = None
    nprobe: int = 32
    pq_m: int | None = None
    gpu_shard: bool = False

    def __post_init__(self) -> None:
        # Specs arrive from JSON/YAML configs, so the annotations alone guarantee nothing at runtime.
        if self.kind not in _KINDS:
            raise ValueError(f"unknown index kind {self.kind!r}; expected one of {', '.join(_KINDS)}")
        minimum = {"hnsw_m": 2, "ef_construction": 1, "ef_search": 1, "nprobe": 1, "nlist": 1, "pq_m": 1}
        optional = {"nlist", "pq_m"}
        for name, low in minimum.items():
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            # bool is an int subclass; True as a list count is a config mistake, not 1.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"IndexSpec.{name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"IndexSpec.{name} must be >= {low}, got {value}")
        if not isinstance(self.gpu_shard, bool):
            raise ValueError(f"IndexSpec.gpu_shard must be true or false, got {self.gpu_shard!r}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> IndexSpec:
        """Inverse of :meth:`to_dict`; missing keys take their defaults, unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in set(d) - known)
        if unknown:
            raise ValueError(f"unknown IndexSpec keys: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        # Any: value types are checked by __post_init__, which gives a better message than a TypeError.
        kwargs: dict[str, Any] = dict(d)
        return cls(**kwargs)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Return a float32, C-contiguous copy of ``vectors`` (n, d) with every row scaled to unit L2 norm.

    All-zero rows stay zero rather than becoming NaN, so an untrained/padding embedding simply scores 0
    against everything.
    """
    x = _as_matrix(vectors, "vectors", allow_empty=True)
    x = np.array(x, dtype=np.float32, order="C", copy=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)):
        # Squares overflow float32 for |values| ~1e19; dividing by inf would silently zero the row.
        raise ValueError("vectors are too large to normalise in float32 (a row norm overflowed)")
    np.divide(x, norms, out=x, where=norms > 0)
    return x


def build_index(vectors: np.ndarray, spec: IndexSpec = IndexSpec(), *, seed: int = 0) -> faiss.Index:
    """Build an inner-product index over ``vectors`` (n, d), row r of the index being row r of the input.

    The caller normalises first if it wants cosine similarity; HNSW and IVF both navigate poorly on raw
    inner products of vectors with very different norms.

    IVF is trained on ``vectors`` themselves (k-means seeded with ``seed``, spherical since the metric is
    inner product); IVF-PQ's codebooks use the same seed. HNSW's level generator is seeded too, but HNSW
    insertion is multi-threaded, so its graph (and thus approximate results) may differ slightly from run
    to run unless faiss runs on one thread (``faiss.omp_set_num_threads(1)``); k-means is reproducible for
    a given seed and thread count. Search parameters (``efSearch``, ``nprobe``) from ``spec`` are set on
    the returned index.
    """
    x = _as_matrix(vectors, "vectors", allow_empty=False)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, d = x.shape
    started = time.perf_counter()

    index: faiss.Index
    if spec.kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif spec.kind == "hnsw":
        hnsw = faiss.IndexHNSWFlat(d, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = spec.ef_construction
        # faiss's type stubs omit HNSW.rng and RandomGenerator, hence the Any.
        graph: Any = hnsw.hnsw
        graph.rng = cast(Any, faiss).RandomGenerator(seed)
        index = hnsw
    else:
        index = _train_ivf(x, spec, seed)
    index.add(x)
    set_search_params(index, spec)
    logger.info("built %s index over %d vectors of dim %d in %.2fs", spec.kind, n, d, time.perf_counter() - started)
    return index


def _train_ivf(x: np.ndarray, spec: IndexSpec, seed: int) -> faiss.Index:
    n, d = x.shape
    nlist = spec.nlist if spec.nlist is not None else _default_nlist(n)
    if nlist > n:
        raise ValueError(f"nlist={nlist} needs at least as many training vectors, got {n}")
    if spec.pq_m is None:
        factory = f"IVF{nlist},Flat"
    else:
        if d % spec.pq_m:
            raise ValueError(f"pq_m={spec.pq_m} must divide the vector dimension d={d}")
        codebook = 2**_PQ_BITS
        if n < codebook:
            raise ValueError(f"IVF-PQ with {_PQ_BITS}-bit codes needs at least {codebook} vectors to train, got {n}")
        factory = f"IVF{nlist},PQ{spec.pq_m}x{_PQ_BITS}"
    # index_factory (rather than constructors) makes the IVF own its coarse quantizer, so no Python
    # reference has to be kept alive alongside it.
    index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    if not isinstance(index, faiss.IndexIVF):  # guards a faiss behaviour change; these strings give IVF
        raise RuntimeError(f"index_factory({factory!r}) did not produce an IVF index")
    index.cp.seed = seed
    if isinstance(index, faiss.IndexIVFPQ):
        index.pq.cp.seed = seed
        # The factory turns polysemous training on, which costs seconds per build and only serves
        # Hamming-distance filtering (polysemous_ht) that this module never enables.
        cast(Any, index).do_polysemous_training = False
    if nlist > n // _MIN_POINTS_PER_CENTROID:
        logger.warning("nlist=%d leaves fewer than %d training vectors per list", nlist, _MIN_POINTS_PER_CENTROID)
    index.train(x)
    return index


def _default_nlist(n: int) -> int:
    return max(1, min(round(4 * math.sqrt(n)), n // _MIN_POINTS_PER_CENTROID))


def set_search_params(index: faiss.Index, spec: IndexSpec) -> None:
    """Apply ``spec.ef_search`` / ``spec.nprobe`` to whichever structure ``index`` actually is.

    The index's own structure decides, not ``spec.kind``: a loaded file is the source of truth, and a
    mismatch is only logged.
    """
    kind = _kind_of(index)
    if kind is None:
        logger.warning("no search parameters known for %s; left unchanged", type(index).__name__)
        return
    if kind != spec.kind:
        logger.warning("spec says %r but the index is %r; applying the %r parameters", spec.kind, kind, kind)
    gpu = _is_gpu_index(index)
    space = faiss.GpuParameterSpace() if gpu else faiss.ParameterSpace()
    if kind == "hnsw":
        space.set_index_parameter(index, "efSearch", spec.ef_search)
    elif kind == "ivf":
        leaf = _unwrap(index)
        nlist = getattr(leaf, "nlist", None)
        # faiss clamps nprobe at search time on CPU; clamping here keeps GPU (max 2048) happy as well.
        nprobe = min(spec.nprobe, int(nlist)) if isinstance(nlist, int) and nlist > 0 else spec.nprobe
        space.set_index_parameter(index, "nprobe", nprobe)


def save_index(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` atomically: readers see either the old file or the complete new one.

    A GPU index is copied back to CPU first, since only CPU indexes serialise.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if _is_gpu_index(index):
        index = faiss.index_gpu_to_cpu(index)
    # Same folder so os.replace is a rename on one filesystem; a unique name so concurrent writers do not
    # clobber each other's temp file; created by faiss (not mkstemp) so it gets the normal umask mode.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        faiss.write_index(index, str(tmp))
        # Flush to disk before the rename, otherwise a crash can leave a renamed but empty file.
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.info("saved %s (%d vectors) to %s", type(index).__name__, index.ntotal, path)


def load_index(path: Path, spec: IndexSpec | None = None, *, gpu: bool | None = None) -> faiss.Index:
    """Read an index written by :func:`save_index`, optionally applying ``spec``'s search parameters.

    ``gpu=None`` moves flat and IVF indexes to the GPU(s) when faiss sees one, ``gpu=False`` never does,
    and ``gpu=True`` requires a GPU (ValueError otherwise). With several GPUs, ``spec.gpu_shard`` picks
    shards over replicas (:func:`gpu_cloner_options`). HNSW always stays on CPU: faiss has no GPU
    search for a CPU-built HNSW graph.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no index file at {path}")
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as err:
        raise ValueError(f"{path} is not a readable faiss index: {err}") from err
    if spec is not None:
        set_search_params(index, spec)

    want_gpu = gpu_available() if gpu is None else gpu
    if not want_gpu:
        return index
    if gpu and not gpu_available():
        raise ValueError("gpu=True but faiss sees no GPU (CPU-only faiss build or no device)")
    kind = _kind_of(index)
    if kind == "hnsw":
        if gpu:
            logger.warning("HNSW has no GPU search in faiss; %s stays on CPU", path)
        return index
    options = gpu_cloner_options(spec)
    try:
        # Clones copy nprobe, so the search parameters set above carry over.
        moved = faiss.index_cpu_to_all_gpus(index, co=options)
    except RuntimeError as err:
        # e.g. an IVF-PQ layout the GPU kernels do not support.
        if gpu:
            raise ValueError(f"could not move {path} to GPU: {err}") from err
        logger.warning("could not move %s to GPU, searching on CPU: %s", path, err)
        return index
    logger.info("loaded %s onto %d GPU(s) (%s)", path, faiss.get_num_gpus(),
                "sharded" if options.shard else "replicated")
    return moved


def gpu_cloner_options(spec: IndexSpec | None) -> Any:
    """faiss's options for copying an index onto every GPU: replicas (the default) or shards (``gpu_shard``).

    Only GPU builds of faiss have the class; callers reach this after :func:`gpu_available`.
    """
    options: Any = cast(Any, faiss).GpuMultipleClonerOptions()
    options.shard = bool(spec is not None and spec.gpu_shard)
    return options


def gpu_available() -> bool:
    """True when this faiss build has the GPU API and sees at least one device."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def search(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    *,
    exclude: Sequence[np.ndarray] | None = None,
    batch_size: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows of ``index`` for each query, best first: ``(scores (m, k) float32, rows (m, k) int64)``.

    ``exclude[i]`` holds index rows (0-based) that must not be returned for query ``i``, e.g. the user's
    history. Each batch searches ``k + max(len(exclude))`` candidates and drops the excluded ones, so a row
    is only missed if the index itself missed it. Positions with nothing left to return hold row -1 and
    score -inf. ``k`` is clipped to the index size. On GPU, faiss caps ``k + max(len(exclude))`` at 2048.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n_rows = int(index.ntotal)
    if n_rows == 0:
        raise ValueError("cannot search an empty index")
    q = _as_matrix(queries, "queries", allow_empty=True)
    if q.shape[1] != index.d:
        raise ValueError(f"queries have dimension {q.shape[1]} but the index has dimension {index.d}")
    q = np.ascontiguousarray(q, dtype=np.float32)
    m = q.shape[0]
    if exclude is not None and len(exclude) != m:
        raise ValueError(f"exclude has {len(exclude)} entries for {m} queries")
    k = min(int(k), n_rows)

    scores = np.empty((m, k), dtype=np.float32)
    rows = np.empty((m, k), dtype=np.int64)
    for start in range(0, m, batch_size):
        stop = min(start + batch_size, m)
        batch_exclude = None if exclude is None else exclude[start:stop]
        scores[start:stop], rows[start:stop] = _search_batch(index, q[start:stop], k, batch_exclude, n_rows)
    return scores, rows


def _search_batch(
    index: faiss.Index, q: np.ndarray, k: int, exclude: Sequence[np.ndarray] | None, n_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    b = q.shape[0]
    excluded_keys = _exclusion_keys(exclude, n_rows) if exclude is not None else None
    if excluded_keys is None or excluded_keys.size == 0:
        scores, rows = index.search(q, k)
        # faiss pads missing results with -1 and -FLT_MAX for inner product; make padding unambiguous.
        scores[rows < 0] = -np.inf
        return scores, rows

    # The most rows any one query can lose to exclusion (keys are unique, so duplicates do not count).
    extra = int(np.bincount(excluded_keys // n_rows, minlength=b).max())
    scores, rows = index.search(q, min(k + extra, n_rows))
    # Membership test for the whole batch at once: encode (query, row) as query * n_rows + row, then one
    # sorted search against the sorted excluded keys. Padding (-1) gets key -1, which matches nothing.
    keys = np.where(rows >= 0, np.arange(b, dtype=np.int64)[:, None] * n_rows + rows, -1)
    pos = np.minimum(np.searchsorted(excluded_keys, keys), excluded_keys.size - 1)
    drop = (excluded_keys[pos] == keys) | (rows < 0)
    # A stable sort on the drop flag moves kept results to the front without disturbing their best-first order.
    order = np.argsort(drop, axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(scores, order, axis=1)
    rows = np.take_along_axis(rows, order, axis=1)
    dropped = np.take_along_axis(drop, order, axis=1)
    scores[dropped] = -np.inf
    rows[dropped] = -1
    return scores, rows


def _exclusion_keys(exclude: Sequence[np.ndarray], n_rows: int) -> np.ndarray:
    """Sorted unique ``query * n_rows + row`` keys for one batch's exclusion lists."""
    arrays = [np.asarray(e).reshape(-1) for e in exclude]
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    if lengths.sum() == 0:
        return np.empty(0, dtype=np.int64)
    # Empty entries are skipped: np.asarray([]) is float64 and would make the whole concatenation float.
    flat = np.concatenate([a for a in arrays if a.size])
    if flat.dtype.kind not in "iu":
        raise ValueError(f"exclude rows must be integers, got dtype {flat.dtype}")
    flat = flat.astype(np.int64, copy=False)
    # Out-of-range rows would alias another query's key; they also signal an id <-> row mapping bug
    # (e.g. 1-based item ids passed as rows), which is better caught than silently ignored.
    if flat.min() < 0 or flat.max() >= n_rows:
        raise ValueError(f"exclude rows must lie in [0, {n_rows}), got values in [{flat.min()}, {flat.max()}]")
    owners = np.repeat(np.arange(len(arrays), dtype=np.int64), lengths)
    return np.unique(owners * n_rows + flat)


def spec_for_catalogue(n_items: int) -> IndexSpec:
    """A sensible default index for a catalogue of ``n_items`` items (``--index auto``).

    Exact (``flat``) search up to 200,000 items: a batch of queries against it is one BLAS matrix product,
    a few ms per query on CPU, with perfect recall and no build time. Beyond that the cost grows linearly
    with the catalogue, so HNSW (M 32, efConstruction 128, efSearch 256) takes over. `seqrec bench index`
    measured that setting on 10^6 clustered 64-d vectors at recall@100 0.98-0.99 and about 1 ms a query on
    one CPU thread (docs/SCALE.md). HNSW is chosen over IVF, which was cheaper on those clustered vectors,
    because its recall degrades gracefully on vectors without cluster structure where IVF's collapses; the
    price is a build of minutes and ~M * 8 bytes per item of graph. How well any setting does depends on
    the vectors: `seqrec bench index --artifact A` measures it on a bundle's own item vectors.
    """
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    if n_items <= _FLAT_MAX_ITEMS:
        return IndexSpec(kind="flat")
    return IndexSpec(kind="hnsw", hnsw_m=32, ef_construction=128, ef_search=256)


def _as_matrix(a: np.ndarray, name: str, *, allow_empty: bool) -> np.ndarray:
    """Validate a 2-D, finite, numeric matrix; returns it as an ndarray without copying when possible."""
    x = np.asarray(a)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got shape {x.shape}")
    if x.shape[1] == 0 or (x.shape[0] == 0 and not allow_empty):
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if x.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be numeric, got dtype {x.dtype}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contain NaN or infinite values")
    return x


def _unwrap(index: faiss.Index) -> faiss.Index:
    """Descend through wrappers (GPU replicas/shards, ID maps, transforms, refinement) to the core index."""
    index = faiss.downcast_index(index)
    while True:
        if isinstance(index, faiss.IndexReplicas | faiss.IndexShards):
            # faiss's type stubs omit ThreadedIndex.count/at, hence the Any.
            threaded: Any = index
            if threaded.count() == 0:
                return index
            index = faiss.downcast_index(threaded.at(0))
        elif isinstance(index, faiss.IndexPreTransform | faiss.IndexIDMap | faiss.IndexIDMap2):
            index = faiss.downcast_index(index.index)
        elif isinstance(index, faiss.IndexRefine):
            index = faiss.downcast_index(index.base_index)
        else:
            return index


def _kind_of(index: faiss.Index) -> IndexKind | None:
    leaf = _unwrap(index)
    if isinstance(leaf, faiss.IndexHNSW):
        return "hnsw"
    gpu_ivf = getattr(faiss, "GpuIndexIVF", None)
    if faiss.try_extract_index_ivf(leaf) is not None or (gpu_ivf is not None and isinstance(leaf, gpu_ivf)):
        return "ivf"
    gpu_flat = getattr(faiss, "GpuIndexFlat", None)
    if isinstance(leaf, faiss.IndexFlat) or (gpu_flat is not None and isinstance(leaf, gpu_flat)):
        return "flat"
    return None


def _is_gpu_index(index: faiss.Index) -> bool:
    gpu_base = getattr(faiss, "GpuIndex", None)
    return gpu_base is not None and isinstance(_unwrap(index), gpu_base)
