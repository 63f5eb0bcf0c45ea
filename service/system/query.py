"""A history of internal ids planned as the system's query, and the cold-start answer: `POST /recommend`
(`service.http.answer`) and `seqrec recommend` plan with the same functions."""

from __future__ import annotations

import numpy as np

from service.system.bundle import Bundle
from service.system.recommend import Query


def seen_ids(bundle: Bundle, seen: frozenset[str]) -> set[int]:
    """The internal ids of the stored seen set's items the catalogue knows."""
    return {j for i in seen if (j := bundle.index_of.get(i)) is not None}


def plan_query(bundle: Bundle, history: list[int], seen: set[int], *, k: int, candidates: int | None,
               exclude_seen: bool, rerank: bool = True, personalize: bool = False,
               allowed: np.ndarray | None = None, user: str | None = None, at: float | None = None,
               last_event: float | None = None) -> Query | None:
    """The engine's query for a history of internal ids (oldest first) and further ``seen`` ids, or None when
    the history is empty (the popularity answer). The model reads the last ``max_len`` items; with
    ``exclude_seen`` the earlier ones and ``seen`` are excluded too; ``user`` names a stored user whose vector the
    bundle may cache (a request that sends its own history names none); ``at``: the time a ranker with request-time
    features scores for (None: the clock when it scores), ``last_event`` the time of the newest interaction (None:
    unknown). `seqrec recommend` plans with it too."""
    used = history[-bundle.max_len :]
    if not used:
        return None
    excluded = {*history[: -bundle.max_len], *seen}
    depth = bundle.default_candidates(k) if candidates is None else candidates
    return Query(used, k=k, candidates=depth, exclude_seen=exclude_seen, rerank=rerank, personalize=personalize,
                 exclude=tuple(sorted(excluded - set(used))) if exclude_seen else (), allowed=allowed, user=user,
                 at=at, last_event=last_event)


def popular(bundle: Bundle, k: int, seen: set[int], allowed: np.ndarray | None = None) -> list[int]:
    """The cold-start answer: the k most popular internal ids outside ``seen``, among ``allowed`` rows."""
    order = bundle.popular
    keep = ~np.isin(order, np.fromiter(seen, dtype=np.int64, count=len(seen)))
    if allowed is not None:
        keep &= allowed[order - 1]
    return order[keep][:k].tolist()
