"""Mining and the offline two-stage candidates, through the served system's steps.

`mine` gives each history items[start:end] the candidates the service would retrieve for it: the served user
vector (`service.system.encode`), the exclusion set and the FAISS search (`service.system.retrieve`), on batches
of histories. The vectors it searched with stay with the groups (`ranker.mining.Mined.user`), so the merge and
the ranker's features read those very vectors; groups loaded from disk get them again from `with_user_vectors`.
`merge_groups` merges the co-occurrence source's list in as the service does (`service.system.retrieve`).
Mining's plans (which positions, which retriever) are `offline.jobs.rank`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ranker.cooc import CoocTable
from ranker.mining import Mined
from ranker.train import Groups
from retriever.windows import padded_slices
from service.system.encode import RawEncoder, unit_user_vectors
from service.system.retrieve import excluded, merge_sources, retrieve


def mine(encode: RawEncoder, index: Any, items: np.ndarray, start: np.ndarray, end: np.ndarray, target: np.ndarray,
         *, depth: int, max_len: int, batch_size: int = 512, exclude_seen: bool = True,
         banned: np.ndarray | None = None, desc: str = "mine") -> Mined:
    """Top-``depth`` index candidates for every history items[start:end], with the user vectors searched with.

    encode: the served encoder (`service.system.loader.served_encoder`); exclude_seen: the whole history is
    excluded, a repeat target included (as the service does with ``exclude_seen``); otherwise nothing is.
    banned: internal ids never to return whatever the history (the catalogue's retired items, as the service
    excludes them).
    """
    retired = np.zeros(0, dtype=np.int64) if banned is None else np.asarray(banned, dtype=np.int64)
    candidates = np.zeros((len(target), depth), dtype=np.int64)
    scores = np.zeros((len(target), depth), dtype=np.float32)
    user = _UserVectors(len(target))
    with torch.inference_mode():
        for rows, history in _batches(items, start, end, max_len, batch_size, desc):
            vectors = user.put(rows, unit_user_vectors(encode, history))
            exclude = [excluded(items[s:e], exclude_seen=exclude_seen, retired=retired)
                       for s, e in zip(start[rows], end[rows], strict=True)]
            found, found_scores = retrieve(index, vectors.numpy(), depth, exclude)
            width = found.shape[1]
            candidates[rows, :width] = found
            scores[rows, :width] = np.where(found > 0, found_scores, 0.0)
    return Mined(start.astype(np.int64), end.astype(np.int64), target.astype(np.int64), candidates, scores,
                 user.all())


def with_user_vectors(mined: Mined, encode: RawEncoder, items: np.ndarray, max_len: int,
                      batch_size: int = 512) -> Mined:
    """``mined`` (loaded from disk) with the user vectors `mine` searched it with, computed again the same way."""
    user = _UserVectors(len(mined))
    with torch.inference_mode():
        for rows, history in _batches(items, mined.start, mined.end, max_len, batch_size, "user vectors"):
            user.put(rows, unit_user_vectors(encode, history))
    return Mined(mined.start, mined.end, mined.target, mined.candidates, mined.scores, user.all())


def merge_groups(groups: Groups, items: np.ndarray, cooc: CoocTable, share: float, item_rows: np.ndarray, *,
                 exclude_seen: bool, banned: np.ndarray | None = None, batch_size: int = 1024) -> Groups:
    """The groups with their candidates replaced by the union of the retriever's and the co-occurrence
    source's lists (`service.system.retrieve.merge_sources`), at the same depth, as the service merges them.

    items: the flat array the histories are slices of; the exclusion set is the whole history
    under ``exclude_seen``, as the retriever's search had it, and ``banned`` (internal ids, the catalogue's retired
    items) always. item_rows: (n_items + 1, D) the scoring rows
    (`retriever.artifact.retrieval_rows`) of the retriever that ranked the groups (its user vectors are
    ``groups.user``).
    """
    mined = groups.mined
    retired = np.zeros(0, dtype=np.int64) if banned is None else np.asarray(banned, dtype=np.int64)
    candidates, scores = np.zeros_like(mined.candidates), np.zeros_like(mined.scores)
    depth = np.full(batch_size, mined.depth)
    for lo in tqdm(range(0, len(groups), batch_size), desc="merge sources", unit="batch", disable=None, leave=False):
        rows = np.arange(lo, min(lo + batch_size, len(groups)))
        exclude = [excluded(items[s:e], exclude_seen=exclude_seen, retired=retired)
                   for s, e in zip(mined.start[rows], mined.end[rows], strict=True)]
        candidates[rows], scores[rows] = merge_sources(cooc, share, groups.history[rows],
                                                       groups.user[torch.from_numpy(rows)].numpy(), item_rows,
                                                       mined.candidates[rows], mined.scores[rows],
                                                       depth[: len(rows)], exclude)
    merged = Mined(mined.start, mined.end, mined.target, candidates, scores, mined.user)
    return Groups(merged, groups.history, groups.user, groups.at, groups.last_event)


def _batches(items: np.ndarray, start: np.ndarray, end: np.ndarray, max_len: int, batch_size: int,
             desc: str) -> Iterator[tuple[np.ndarray, Tensor]]:
    """(rows, (b, max_len) left-padded histories) in batches of similar lengths (less padding), the order the
    user vectors are always computed in."""
    order = np.argsort(end - start, kind="stable")
    for lo in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=None, leave=False):
        rows = order[lo : lo + batch_size]
        yield rows, torch.from_numpy(padded_slices(items, start[rows], end[rows], max_len))


class _UserVectors:
    """(G, D) user vectors filled batch by batch, in any row order."""

    def __init__(self, n: int) -> None:
        self.n, self.vectors = n, None if n else torch.zeros(0, 1)

    def put(self, rows: np.ndarray, vectors: Tensor) -> Tensor:
        if self.vectors is None:
            self.vectors = torch.zeros(self.n, vectors.shape[1])
        self.vectors[torch.from_numpy(rows)] = vectors
        return vectors

    def all(self) -> Tensor:
        assert self.vectors is not None
        return self.vectors
