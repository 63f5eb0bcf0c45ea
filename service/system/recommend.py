"""The two-stage recommendation, callable without HTTP: histories -> user vectors -> FAISS top-N (+ the
co-occurrence source) -> the ranker's features -> ranker scores -> top k.

`recommend_batch` answers several queries in one forward pass, composing the steps that mining and the offline
evaluation call too: the user vector (`service.system.encode`), the exclusion set, the search and the merge of
sources (`service.system.retrieve`), the rerank and the top k (`service.system.rerank`). The engine
(`service.http.engine`) feeds it micro-batches, `service.system.loader` runs it once as the smoke query of every
bundle it loads, and `seqrec recommend` and the parity tests call it directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from common.errors import SeqrecError
from retriever.windows import padded_slices
from service.system.bundle import Bundle
from service.system.encode import unit_user_vectors
from service.system.rerank import rerank_scores, top_k
from service.system.retrieve import excluded, merge_sources, retrieve


@dataclass(frozen=True)
class Query:
    history: list[int]  # internal ids, oldest first, already cut to max_len
    k: int
    candidates: int
    exclude_seen: bool = True
    rerank: bool = True
    personalize: bool = False
    exclude: tuple[int, ...] = ()  # further internal ids never to return (the rest of a long history)
    # (n_items,) bool over index rows (internal id - 1): the only items to return (business filters), None = all;
    # queries sharing one array object are searched together
    allowed: np.ndarray | None = field(default=None, compare=False)
    user: str | None = None  # the stored user whose history this is: its vector is cached (`service.system.cache`)
    at: float | None = None  # the time (unix seconds) a ranker with request-time features scores for; None: now
    last_event: float | None = None  # the time of the user's newest interaction, when known (user_idle_days)


@dataclass
class Result:
    items: list[tuple[int, float, float]]  # (internal id, score, retrieval score), best first
    bundle: Bundle  # the bundle that answered (its ids and metadata describe the items)
    reranked: bool
    timing_ms: dict[str, float]


class NeedsCausalModel(SeqrecError):
    """`personalize` asked of a bundle whose encoder reads the whole window (its input holds the targets)."""


def recommend_batch(bundle: Bundle, queries: Sequence[Query], *, beta: float = 1e-5,
                    steps: int = 1) -> list[Result]:
    """Retrieve, rerank and cut to k for a batch of queries in one forward pass.

    Queries with ``personalize`` get PCRec-simple user vectors (``steps`` gradient steps of rate
    ``beta`` on their own history, on a private copy of the weights), one user at a time.
    """
    t0 = time.perf_counter()
    history = _padded_histories(queries, bundle.max_len)
    user = _user_vectors(bundle, history, queries, beta=beta, steps=steps)
    t1 = time.perf_counter()
    candidates, scores = _retrieve(bundle, user, queries)
    candidates, scores = _second_source(bundle, history, user, candidates, scores, queries)
    t2 = time.perf_counter()
    final, reranked = _rerank(bundle, history, user, candidates, scores, queries)
    t3 = time.perf_counter()
    timing = {"encode": 1000 * (t1 - t0), "search": 1000 * (t2 - t1), "rerank": 1000 * (t3 - t2)}
    out = []
    for i, q in enumerate(queries):
        order = top_k(final[i], candidates[i], q.k)
        items = [(int(candidates[i, j]), float(final[i, j]), float(scores[i, j])) for j in order]
        out.append(Result(items, bundle, i in reranked, timing))
    return out


def _padded_histories(queries: Sequence[Query], max_len: int) -> torch.Tensor:
    """(B, max_len) internal ids, left-padded with 0."""
    lengths = np.array([len(q.history) for q in queries])
    flat = np.fromiter((i for q in queries for i in q.history), dtype=np.int64, count=int(lengths.sum()))
    ends = np.cumsum(lengths)
    return torch.from_numpy(padded_slices(flat, ends - lengths, ends, max_len))


def _user_vectors(bundle: Bundle, history: torch.Tensor, queries: Sequence[Query], *, beta: float,
                  steps: int) -> torch.Tensor:
    """(B, D) unit user vectors: cached for stored users whose history has not changed, one forward pass for
    the other plain queries, PCRec-simple for the personalised ones."""
    cache = bundle.user_cache
    cached = {i: v for i, q in enumerate(queries) if q.user is not None and not q.personalize
              and (v := cache.get(q.user, q.history)) is not None}
    plain = [i for i, q in enumerate(queries) if not q.personalize and i not in cached]
    if len(plain) == len(queries):  # the common case: no row indexing (torch's costs more than the copy it saves)
        user = unit_user_vectors(bundle.encode, history)
    else:
        user = torch.zeros(len(queries), bundle.vectors.shape[1])  # a normal tensor: personalize writes into it
        if plain:
            user[plain] = unit_user_vectors(bundle.encode, history[plain])
    special = [i for i, q in enumerate(queries) if q.personalize]
    if special:
        model = bundle.artifact.model
        user[special] = unit_user_vectors(lambda h: model.personalize(h, beta=beta, steps=steps).detach(),
                                          history[special])
    for i, vector in cached.items():
        user[i] = vector
    for i in plain:
        if (name := queries[i].user) is not None:
            cache.put(name, queries[i].history, user[i])
    return user


def _retrieve(bundle: Bundle, user: torch.Tensor, queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
    """(B, depth) candidate internal ids (0 = none) and their retrieval scores (-inf = none)."""
    depth = min(max(max(q.candidates, q.k) for q in queries), bundle.n_items)
    exclude = [excluded(q.history, exclude_seen=q.exclude_seen, exclude=q.exclude, retired=bundle.retired)
               for q in queries]
    index = bundle.artifact.index
    assert index is not None  # load_bundle always loads it
    candidates, scores = retrieve(index, user.numpy(), depth, exclude, allowed=[q.allowed for q in queries],
                                  index_vectors=bundle.index_vectors)
    for i, q in enumerate(queries):  # each request keeps its own retrieval depth
        n = max(q.candidates, q.k)
        candidates[i, n:] = 0
        scores[i, n:] = -np.inf
    return candidates, scores


def _second_source(bundle: Bundle, history: torch.Tensor, user: torch.Tensor, candidates: np.ndarray,
                   scores: np.ndarray, queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of the rows the ranker scores, merged with the co-occurrence source's list when
    the ranker was trained on that union (`ranker.cooc.union`, as mining and evaluation merge)."""
    ranker = bundle.ranker
    share = None if ranker is None else ranker.cooc_share
    rows = [i for i, q in enumerate(queries) if q.rerank] if share is not None else []
    if not rows:
        return candidates, scores
    assert ranker is not None
    assert ranker.cooc is not None
    assert share is not None
    depth = np.array([min(max(queries[i].candidates, queries[i].k), candidates.shape[1]) for i in rows])
    exclude = [excluded(queries[i].history, exclude_seen=queries[i].exclude_seen, exclude=queries[i].exclude,
                        retired=bundle.retired, allowed=queries[i].allowed) for i in rows]
    merged, merged_scores = merge_sources(ranker.cooc, share, history[rows].numpy(), user[rows].numpy(),
                                          bundle.retrieval_rows, candidates[rows],
                                          np.where(candidates[rows] > 0, scores[rows], 0.0), depth, exclude)
    candidates[rows] = merged
    scores[rows] = np.where(merged > 0, merged_scores, -np.inf)
    return candidates, scores


def _rerank(bundle: Bundle, history: torch.Tensor, user: torch.Tensor, candidates: np.ndarray, scores: np.ndarray,
            queries: Sequence[Query]) -> tuple[np.ndarray, set[int]]:
    """(B, depth) final scores (the retrieval scores where nothing reranks) and the rows the ranker scored."""
    final = scores.astype(np.float64)
    rerank = [i for i, q in enumerate(queries) if q.rerank and bundle.ranker is not None]
    if rerank:
        assert bundle.ranker is not None
        assert bundle.tables is not None
        every = len(rerank) == len(queries)  # the common case: no row indexing (torch's costs ~0.1 ms a tensor)
        rows = slice(None) if every else rerank
        at = last_event = None
        if bundle.ranker.needs_time:
            now = time.time()
            at = torch.tensor([now if queries[i].at is None else queries[i].at for i in rerank], dtype=torch.float64)
            last_event = torch.tensor([math.nan if queries[i].last_event is None else queries[i].last_event
                                       for i in rerank], dtype=torch.float64)
        cand = candidates[rows]
        final[rows] = rerank_scores(bundle.ranker.ranker.score, bundle.tables, bundle.vectors,
                                    history if every else history[rerank], user if every else user[rerank],
                                    torch.from_numpy(cand), torch.from_numpy(np.where(cand > 0, scores[rows], 0.0)),
                                    extras=bundle.ranker.extras, at=at, last_event=last_event).numpy()
    return final, set(rerank)
