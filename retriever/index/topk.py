"""Top-k search over an index, with per-query rows to leave out (a user's history)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import faiss
import numpy as np

from retriever.index.build import as_matrix
from retriever.index.device import is_gpu_index, kind_of, unwrap


def search(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    *,
    exclude: Sequence[np.ndarray] | None = None,
    batch_size: int = 4096,
    params: faiss.SearchParameters | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows of ``index`` for each query, best first: ``(scores (m, k) float32, rows (m, k) int64)``.

    ``exclude[i]`` holds index rows (0-based) that must not be returned for query ``i``, e.g. the user's
    history. Each batch searches ``k + max(len(exclude))`` candidates and drops the excluded ones, so a row
    is only missed if the index itself missed it. Positions with nothing left to return hold row -1 and
    score -inf. ``k`` is clipped to the index size. On GPU, faiss caps ``k + max(len(exclude))`` at 2048.
    ``params`` go to every ``index.search`` (an ID selector: `retriever.index.filtered`). Without them, a query
    an IVF index answers short (`_probe_every_list`) is searched again over every list.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n_rows = int(index.ntotal)
    if n_rows == 0:
        raise ValueError("cannot search an empty index")
    q = as_matrix(queries, "queries", allow_empty=True)
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
        scores[start:stop], rows[start:stop] = _search_batch(index, q[start:stop], k, batch_exclude, n_rows,
                                                                   params)
    if params is None:
        _probe_every_list(index, q, k, exclude, scores, rows)
    return scores, rows


def _probe_every_list(index: faiss.Index, q: np.ndarray, k: int, exclude: Sequence[np.ndarray] | None,
                      scores: np.ndarray, rows: np.ndarray) -> None:
    """An IVF index probes ``nprobe`` of its lists; where they hold fewer than k rows the exclusions leave, a query
    got fewer than k. Those queries are searched again over every list (in place), so a list comes back short
    only when the catalogue is: what the service promises (k whenever k eligible items remain), and what mining
    and evaluation, which search here too, count. Only a CPU IVF index without wrappers takes the parameter."""
    if kind_of(index) != "ivf" or is_gpu_index(index):
        return
    core = unwrap(index)
    leaf = cast(Any, core)
    if type(faiss.downcast_index(index)) is not type(core) or leaf.nprobe >= leaf.nlist:
        return
    found = (rows >= 0).sum(axis=1)
    maybe = np.flatnonzero(found < k)  # only these can be short; their exclusions are counted below
    if maybe.size == 0:
        return
    n_rows = int(index.ntotal)
    lost = np.zeros(maybe.size, dtype=np.int64) if exclude is None else np.array(
        [np.unique(exclude[int(i)]).size for i in maybe], dtype=np.int64)
    short = maybe[found[maybe] < np.minimum(k, n_rows - lost)]
    if short.size == 0:
        return
    every: Any = faiss  # faiss's type stubs omit the search parameters' keyword arguments
    params = every.SearchParametersIVF(nprobe=int(leaf.nlist))
    again = None if exclude is None else [exclude[int(i)] for i in short]
    scores[short], rows[short] = _search_batch(index, q[short], k, again, n_rows, params)


def _search_batch(
    index: faiss.Index, q: np.ndarray, k: int, exclude: Sequence[np.ndarray] | None, n_rows: int,
    params: faiss.SearchParameters | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    b = q.shape[0]
    excluded_keys = _exclusion_keys(exclude, n_rows) if exclude is not None else None
    if excluded_keys is None or excluded_keys.size == 0:
        scores, rows = index.search(q, k, params=params)
        # faiss pads missing results with -1 and -FLT_MAX for inner product; make padding unambiguous.
        scores[rows < 0] = -np.inf
        return scores, rows

    # The most rows any one query can lose to exclusion (keys are unique, so duplicates do not count).
    extra = int(np.bincount(excluded_keys // n_rows, minlength=b).max())
    scores, rows = index.search(q, min(k + extra, n_rows), params=params)
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
