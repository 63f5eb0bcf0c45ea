"""Top-k search restricted to an allow-list of rows (business filters), with a guarantee.

The allowed rows become a FAISS ``IDSelectorBitmap`` handed to the index through its search parameters
(``SearchParameters`` for flat, ``SearchParametersHNSW`` keeping the index's ``efSearch``,
``SearchParametersIVF`` keeping its ``nprobe``), so the index itself never returns a row outside the list.
An approximate index can still come back short (HNSW's graph walk may not reach enough allowed nodes
when few are allowed); every query that gets fewer rows than its allowed, non-excluded rows could give
is answered again exactly, by inner products over the allowed rows' vectors. Small allow-lists
(``EXACT_MAX`` rows or fewer) and indexes without selector support (GPU) go that exact way directly.
So: never a row outside the list, and exactly ``min(k, allowed rows left)`` rows for every query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import faiss
import numpy as np

from retriever.index.device import is_gpu_index, kind_of, unwrap
from retriever.index.topk import search

EXACT_MAX = 2048  # allowed rows up to which an exact scan is both cheaper and exact


def search_allowed(index: faiss.Index, vectors: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray, *,
                   exclude: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Like `retriever.index.search`, over the rows where ``allowed`` (bool, (n_rows,)) is true only.

    ``vectors`` (n_rows, d) are the rows the index was built from (the exact fallback scores them).
    Returns ``(scores (m, k), rows (m, k))``; positions with nothing left hold row -1 and score -inf.
    """
    allowed = np.asarray(allowed, dtype=bool)
    n_rows = int(index.ntotal)
    if allowed.shape != (n_rows,):
        raise ValueError(f"allowed has shape {allowed.shape}; expected ({n_rows},)")
    k = min(int(k), n_rows)
    m = len(queries)
    exclude = [np.empty(0, dtype=np.int64)] * m if exclude is None else exclude
    # what each query can get: its allowed rows less its excluded allowed rows
    reachable = np.array([int(allowed.sum()) - int(allowed[np.unique(e)].sum()) for e in exclude], dtype=np.int64)
    params = None if allowed.sum() <= EXACT_MAX else _selector_params(index, allowed)
    if params is None:
        return _exact(vectors, queries, k, allowed, exclude)
    scores, rows = search(index, queries, k, exclude=exclude, params=params)
    short = np.flatnonzero((rows >= 0).sum(axis=1) < np.minimum(k, reachable))
    if short.size:
        scores[short], rows[short] = _exact(vectors, queries[short], k, allowed, [exclude[int(i)] for i in short])
    return scores, rows


def _selector_params(index: faiss.Index, allowed: np.ndarray) -> faiss.SearchParameters | None:
    """Search parameters carrying a bitmap selector of ``allowed``, or None where the index takes none."""
    if is_gpu_index(index) or type(faiss.downcast_index(index)) is not type(unwrap(index)):
        return None  # GPU indexes take no selector; wrappers (ID maps, transforms) would translate the rows
    bits = np.packbits(allowed, bitorder="little")
    selector = faiss.IDSelectorBitmap(len(allowed), faiss.swig_ptr(bits))
    kind = kind_of(index)
    fx: Any = faiss  # faiss's type stubs omit the search parameters' keyword arguments, hence the Any
    leaf: Any = unwrap(index)
    if kind == "hnsw":
        params = fx.SearchParametersHNSW(sel=selector, efSearch=int(leaf.hnsw.efSearch))
    elif kind == "ivf":
        params = fx.SearchParametersIVF(sel=selector, nprobe=int(leaf.nprobe))
    elif kind == "flat":
        params = fx.SearchParameters(sel=selector)
    else:
        return None
    # the selector reads ``bits`` and the parameters read the selector: both must live as long as the parameters
    params.keep_alive = (selector, bits)
    return cast(faiss.SearchParameters, params)


def _exact(vectors: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray,
           exclude: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Top k by exact inner product over the allowed rows, best first, ties in row order."""
    candidates = np.flatnonzero(allowed)
    m = len(queries)
    scores = np.full((m, k), -np.inf, dtype=np.float32)
    rows = np.full((m, k), -1, dtype=np.int64)
    if candidates.size == 0:
        return scores, rows
    all_scores = np.asarray(queries, dtype=np.float32) @ np.asarray(vectors, dtype=np.float32)[candidates].T
    for i in range(m):
        row_scores = all_scores[i]
        keep = ~np.isin(candidates, exclude[i])
        order = np.flatnonzero(keep)
        order = order[np.argsort(-row_scores[order], kind="stable")][:k]
        scores[i, : order.size] = row_scores[order]
        rows[i, : order.size] = candidates[order]
    return scores, rows
