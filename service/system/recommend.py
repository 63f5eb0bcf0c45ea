"""The two-stage recommendation, callable without HTTP: histories -> user vectors -> FAISS top-N ->
the ranker's features -> ranker scores -> top k.

`recommend_batch` answers several queries in one forward pass; the engine (`service.http.engine`) feeds it
micro-batches, `service.system.bundle` runs it once as the smoke query of every bundle it loads, and the parity
tests call it directly. The features come from the same code as the offline evaluation
(`ranker.features.compute_features`), so serving and training cannot drift.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch

from common.errors import SeqrecError
from ranker.artifact import RankerArtifact
from ranker.cooc import cooc_top, recent_items, union
from ranker.features import compute_features
from ranker.tables import TorchTables
from retriever.artifact import RetrieverArtifact
from retriever.index import search
from retriever.index.filtered import search_allowed
from retriever.windows import padded_slices
from service.system.cache import UserVectors


class Servable(Protocol):
    """What the two stages read from a bundle; `service.system.bundle.Bundle` is one. A protocol rather than that
    class, because loading a bundle runs a smoke query through this module."""

    @property
    def artifact(self) -> RetrieverArtifact: ...
    @property
    def ranker(self) -> RankerArtifact | None: ...
    @property
    def tables(self) -> TorchTables | None: ...
    @property
    def vectors(self) -> torch.Tensor: ...  # (n_items + 1, D) unit item vectors, row 0 = 0
    @property
    def index_vectors(self) -> np.ndarray: ...  # (n_items, D) the rows the FAISS index holds
    @property
    def retrieval_rows(self) -> np.ndarray: ...  # (n_items + 1, D) the index's rows, row 0 = 0
    @property
    def user_cache(self) -> UserVectors: ...
    @property
    def max_len(self) -> int: ...
    @property
    def n_items(self) -> int: ...
    def encode(self, history: torch.Tensor) -> torch.Tensor: ...  # (B, T) -> (B, D) float32, not normalised
    @property
    def retired(self) -> frozenset[int]: ...  # internal ids never to return (service/system/catalog.py)


B = TypeVar("B", bound=Servable)


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
class Result(Generic[B]):
    items: list[tuple[int, float, float]]  # (internal id, score, retrieval score), best first
    bundle: B  # the bundle that answered (its ids and metadata describe the items)
    reranked: bool
    timing_ms: dict[str, float]


class NeedsCausalModel(SeqrecError):
    """`personalize` asked of a bundle whose encoder reads the whole window (its input holds the targets)."""


def recommend_batch(bundle: B, queries: Sequence[Query], *, beta: float = 1e-5, steps: int = 1) -> list[Result[B]]:
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
        order = np.flatnonzero(candidates[i] > 0)
        # best first; ties keep the retrieval order (stable), so the order never depends on the batch
        order = order[np.argsort(-final[i, order], kind="stable")][: q.k]
        items = [(int(candidates[i, j]), float(final[i, j]), float(scores[i, j])) for j in order]
        out.append(Result(items, bundle, i in reranked, timing))
    return out


def _padded_histories(queries: Sequence[Query], max_len: int) -> torch.Tensor:
    """(B, max_len) internal ids, left-padded with 0."""
    lengths = np.array([len(q.history) for q in queries])
    flat = np.fromiter((i for q in queries for i in q.history), dtype=np.int64, count=int(lengths.sum()))
    ends = np.cumsum(lengths)
    return torch.from_numpy(padded_slices(flat, ends - lengths, ends, max_len))


def _user_vectors(bundle: Servable, history: torch.Tensor, queries: Sequence[Query], *, beta: float,
                  steps: int) -> torch.Tensor:
    """(B, D) unit user vectors: cached for stored users whose history has not changed, one forward pass for
    the other plain queries, PCRec-simple for the personalised ones."""
    cache = bundle.user_cache
    cached = {i: v for i, q in enumerate(queries) if q.user is not None and not q.personalize
              and (v := cache.get(q.user, q.history)) is not None}
    plain = [i for i, q in enumerate(queries) if not q.personalize and i not in cached]
    if len(plain) == len(queries):  # the common case: no row indexing (torch's costs more than the copy it saves)
        user = bundle.encode(history).clone()
    else:
        user = torch.zeros(len(queries), bundle.vectors.shape[1])  # a normal tensor: personalize writes into it
        if plain:
            user[plain] = bundle.encode(history[plain])
    special = [i for i, q in enumerate(queries) if q.personalize]
    if special:
        model = bundle.artifact.model
        user[special] = model.personalize(history[special], beta=beta, steps=steps).detach().float()
    user = torch.nn.functional.normalize(user, dim=-1)
    for i, vector in cached.items():
        user[i] = vector
    for i in plain:
        if (name := queries[i].user) is not None:
            cache.put(name, queries[i].history, user[i])
    return user


def _retrieve(bundle: Servable, user: torch.Tensor, queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
    """(B, depth) candidate internal ids (0 = none) and their retrieval scores (-inf = none)."""
    depth = min(max(max(q.candidates, q.k) for q in queries), bundle.n_items)
    exclude = [_excluded(q, bundle.retired) - 1 for q in queries]
    scores, rows = _search(bundle, user.numpy(), depth, exclude, queries)
    candidates = np.where(rows >= 0, rows + 1, 0)
    for i, q in enumerate(queries):  # each request keeps its own retrieval depth
        n = max(q.candidates, q.k)
        candidates[i, n:] = 0
        scores[i, n:] = -np.inf
    return candidates, scores


def _search(bundle: Servable, user: np.ndarray, depth: int, exclude: list[np.ndarray],
            queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
    """FAISS top-depth rows and scores; queries with an allow-list searched per shared list, from it only."""
    index = bundle.artifact.index
    assert index is not None  # load_bundle always loads it
    groups: dict[int, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(0 if q.allowed is None else id(q.allowed), []).append(i)
    if list(groups) == [0]:
        return search(index, user, depth, exclude=exclude)
    scores = np.full((len(queries), depth), -np.inf, dtype=np.float32)
    rows = np.full((len(queries), depth), -1, dtype=np.int64)
    for members in groups.values():
        allowed, wanted = queries[members[0]].allowed, [exclude[i] for i in members]
        if allowed is None:
            got = search(index, user[members], depth, exclude=wanted)
        else:
            got = search_allowed(index, bundle.index_vectors, user[members], depth, allowed, exclude=wanted)
        scores[members, : got[0].shape[1]], rows[members, : got[1].shape[1]] = got
    return scores, rows


def _excluded(query: Query, retired: frozenset[int] = frozenset(), *, eligible: bool = False) -> np.ndarray:
    """The internal ids a query must never get back: its history under exclude_seen, its own exclusions and the
    catalogue's retired items;
    with ``eligible``, also every item outside its allow-list (the business filters), for a source that
    cannot take the allow-list itself."""
    parts = [np.asarray(query.history if query.exclude_seen else (), dtype=np.int64),
             np.asarray(query.exclude, dtype=np.int64)]
    if retired:
        parts.append(np.fromiter(retired, dtype=np.int64, count=len(retired)))
    banned = np.unique(np.concatenate(parts))  # sorted, unique
    if eligible and query.allowed is not None:
        banned = np.union1d(banned, np.flatnonzero(~query.allowed) + 1)
    return banned


def _second_source(bundle: Servable, history: torch.Tensor, user: torch.Tensor, candidates: np.ndarray,
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
    found, _ = cooc_top(ranker.cooc, recent_items(history[rows].numpy(), ranker.cooc.last),
                        [_excluded(queries[i], bundle.retired, eligible=True) for i in rows], int(depth.max()))
    merged, merged_scores = union(candidates[rows], np.where(candidates[rows] > 0, scores[rows], 0.0), found,
                                  user[rows].numpy(), bundle.retrieval_rows, depth, share)
    candidates[rows] = merged
    scores[rows] = np.where(merged > 0, merged_scores, -np.inf)
    return candidates, scores


def _rerank(bundle: Servable, history: torch.Tensor, user: torch.Tensor, candidates: np.ndarray, scores: np.ndarray,
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
        with torch.inference_mode():
            cand = candidates[rows]
            batch = compute_features(bundle.tables, bundle.vectors, history if every else history[rerank],
                                     user if every else user[rerank], torch.from_numpy(cand),
                                     torch.from_numpy(np.where(cand > 0, scores[rows], 0.0)),
                                     extras=bundle.ranker.extras, at=at, last_event=last_event)
            final[rows] = bundle.ranker.ranker.score(batch).numpy()
    return final, set(rerank)
