"""Build an index over item vectors and write it atomically."""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, cast

import faiss
import numpy as np

from retriever.index.device import is_gpu_index, set_search_params
from retriever.index.spec import IndexSpec, IndexSpecError

logger = logging.getLogger(__name__)

# faiss k-means warns below 39 training points per centroid and its clusters get noisy; the default nlist
# respects that floor.
_MIN_POINTS_PER_CENTROID = 39
_PQ_BITS = 8
DEFAULT_SPEC = IndexSpec()  # exact search


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Return a float32, C-contiguous copy of ``vectors`` (n, d) with every row scaled to unit L2 norm.

    All-zero rows stay zero rather than becoming NaN, so an untrained/padding embedding simply scores 0
    against everything.
    """
    x = as_matrix(vectors, "vectors", allow_empty=True)
    x = np.array(x, dtype=np.float32, order="C", copy=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not np.all(np.isfinite(norms)):
        # Squares overflow float32 for |values| ~1e19; dividing by inf would silently zero the row.
        raise ValueError("vectors are too large to normalise in float32 (a row norm overflowed)")
    np.divide(x, norms, out=x, where=norms > 0)
    return x


def build_index(vectors: np.ndarray, spec: IndexSpec = DEFAULT_SPEC, *, seed: int = 0) -> faiss.Index:
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
    x = as_matrix(vectors, "vectors", allow_empty=False)
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
        raise IndexSpecError(f"nlist={nlist} needs at least as many training vectors, got {n}")
    if spec.pq_m is None:
        factory = f"IVF{nlist},Flat"
    else:
        if d % spec.pq_m:
            raise IndexSpecError(f"pq_m={spec.pq_m} must divide the vector dimension d={d}")
        codebook = 2**_PQ_BITS
        if n < codebook:
            raise IndexSpecError(
                f"IVF-PQ with {_PQ_BITS}-bit codes needs at least {codebook} vectors to train, got {n}")
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


def save_index(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` atomically: readers see either the old file or the complete new one.

    A GPU index is copied back to CPU first, since only CPU indexes serialise.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_gpu_index(index):
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


def as_matrix(a: np.ndarray, name: str, *, allow_empty: bool) -> np.ndarray:
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
