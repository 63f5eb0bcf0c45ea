"""The first stage: the exclusion set, the FAISS search under it (and under an allow-list), and the merge with
the co-occurrence source.

One definition of each step, for every caller: the service (`service.system.recommend.recommend_batch`), mining
and `seqrec evaluate` (`offline.jobs.mine`), so the candidates a ranker trains and is measured on are the ones it
is served with. Histories and exclusions are internal ids (1..n_items); index row r is internal id r + 1.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from ranker.cooc import CoocTable, cooc_top, recent_items, union
from retriever.index import search
from retriever.index.filtered import search_allowed


def excluded(history: Sequence[int] | np.ndarray, *, exclude_seen: bool, exclude: Sequence[int] | np.ndarray = (),
             retired: Collection[int] | np.ndarray = (), allowed: np.ndarray | None = None) -> np.ndarray:
    """Sorted unique internal ids never to return: the history under ``exclude_seen``, the further ``exclude``
    (the rest of a long history), the catalogue's ``retired`` items; with ``allowed`` ((n_items,) bool over index
    rows), also every item outside that allow-list, for a source that cannot take the allow-list itself."""
    parts = [np.asarray(history if exclude_seen else (), dtype=np.int64), np.asarray(exclude, dtype=np.int64)]
    if len(retired):
        parts.append(retired if isinstance(retired, np.ndarray)
                     else np.fromiter(retired, dtype=np.int64, count=len(retired)))
    banned = np.unique(np.concatenate(parts))  # sorted, unique
    if allowed is not None:
        banned = np.union1d(banned, np.flatnonzero(~allowed) + 1)
    return banned


def retrieve(index: Any, user: np.ndarray, depth: int, exclude: Sequence[np.ndarray], *,
             allowed: Sequence[np.ndarray | None] | None = None,
             index_vectors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(B, width) candidate internal ids, best first (0 = none), and their retrieval scores (-inf = none): the
    FAISS top ``depth`` for (B, D) unit user vectors, none of a row's ``exclude`` (internal ids, `excluded`).

    allowed: per row, None or an (n_items,) bool allow-list over index rows; rows sharing one array object are
    searched together, from it only (the index's rows ``index_vectors`` score them)."""
    rows_out = [e - 1 for e in exclude]
    if allowed is None or all(a is None for a in allowed):
        scores, rows = search(index, user, depth, exclude=rows_out)
    else:
        assert index_vectors is not None
        scores, rows = _search_allowed(index, index_vectors, user, depth, rows_out, allowed)
    return np.where(rows >= 0, rows + 1, 0), scores


def _search_allowed(index: Any, index_vectors: np.ndarray, user: np.ndarray, depth: int, exclude: list[np.ndarray],
                    allowed: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """FAISS top-depth rows and scores, the rows with an allow-list searched per shared list, from it only."""
    groups: dict[int, list[int]] = {}
    for i, rows_allowed in enumerate(allowed):
        groups.setdefault(0 if rows_allowed is None else id(rows_allowed), []).append(i)
    scores = np.full((len(user), depth), -np.inf, dtype=np.float32)
    rows = np.full((len(user), depth), -1, dtype=np.int64)
    for members in groups.values():
        only, wanted = allowed[members[0]], [exclude[i] for i in members]
        if only is None:
            got = search(index, user[members], depth, exclude=wanted)
        else:
            got = search_allowed(index, index_vectors, user[members], depth, only, exclude=wanted)
        scores[members, : got[0].shape[1]], rows[members, : got[1].shape[1]] = got
    return scores, rows


def merge_sources(cooc: CoocTable, share: float, history: np.ndarray, user: np.ndarray, item_rows: np.ndarray,
                  candidates: np.ndarray, scores: np.ndarray, depth: np.ndarray,
                  exclude: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The retriever's candidates merged with the co-occurrence source's list by `ranker.cooc.union`, each row
    at its own ``depth``: (B, width) ids (0 = empty) and float32 retrieval scores (0 in empty slots).

    history: (B, T) left-padded internal ids (the co-occurrence source reads the newest); user: (B, D) unit user
    vectors; item_rows: (n_items + 1, D) the scoring rows (`retriever.artifact.retrieval_rows`); scores: the
    candidates' retrieval scores, 0 in empty slots; exclude: per row, internal ids never to return (`excluded`,
    with the allow-list where there is one)."""
    found, _ = cooc_top(cooc, recent_items(history, cooc.last), exclude, int(depth.max()))
    return union(candidates, scores, found, user, item_rows, depth, share)
