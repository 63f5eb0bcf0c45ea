"""The second candidate source: an item-to-item "follows" table from training positions only.

``CoocTable.build`` counts, over the training sequences, how often item b comes 1..WINDOW
positions after item a, each occurrence weighted 1/lag (the next item counts most), and
keeps for every a its TOP neighbours by P(b follows a) = weight(a, b) / weight(a, anything).
A history's co-occurrence score of an item c is the recency-weighted sum over its last
``last`` items h_0 (newest), h_1, ...: sum_j decay^j * P(c follows h_j).

`cooc_top` turns that score into a candidate list (the history's exclusion set honoured, ties
by item id) and `union` merges it with the retriever's FAISS list (the merge rule in its
docstring). Mining, the offline evaluation and the service call both, so the union the ranker
was trained and evaluated on is the one served. The table is saved beside the ranker as
``cooc.npz`` (numpy arrays only, loaded with ``allow_pickle=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

COOC_FILE = "cooc.npz"
WINDOW = 5  # b "follows" a when it comes 1..WINDOW positions after a; weight 1/lag
TOP = 100  # neighbours kept per item
LAST = 10  # history items the source reads (newest first)
DECAY = 0.7  # weight of the j-th newest history item: DECAY ** j
TREND_POSITIONS = 3  # "recent" training positions per user for the popularity trend


@dataclass(frozen=True)
class CoocTable:
    """neighbors/weights: (n_items + 1, TOP) item ids (0 = none) and P(b follows a), best first;
    trend: (n_items + 1,) log ratio of an item's share among each user's last TREND_POSITIONS
    training items to its share among all training items."""

    neighbors: np.ndarray
    weights: np.ndarray
    trend: np.ndarray
    decay: float = DECAY
    last: int = LAST

    @property
    def n_items(self) -> int:
        return len(self.neighbors) - 1

    @classmethod
    def build(cls, offsets: np.ndarray, items: np.ndarray, n_items: int, *, top: int = TOP, window: int = WINDOW,
              decay: float = DECAY, last: int = LAST) -> CoocTable:
        """offsets/items: CSR training positions (no validation or test target)."""
        n1 = n_items + 1
        position = np.arange(len(items)) - np.repeat(offsets[:-1], np.diff(offsets))  # index inside the user's row
        keys, weights = [], []
        for lag in range(1, window + 1):
            same_user = position[lag:] >= lag
            keys.append(items[:-lag][same_user].astype(np.int64) * n1 + items[lag:][same_user])
            weights.append(np.full(int(same_user.sum()), 1.0 / lag))
        flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        unique, inverse = np.unique(flat, return_inverse=True)
        weight = np.bincount(inverse, weights=np.concatenate(weights) if weights else None, minlength=len(unique))
        source, target = unique // n1, unique % n1
        weight = weight / np.bincount(source, weights=weight, minlength=n1)[source]  # P(target follows source)
        order = np.lexsort((target, -weight, source))  # per source: best first, ties by id
        source, target, weight = source[order], target[order], weight[order]
        rank = np.arange(len(source)) - np.searchsorted(source, source)  # 0-based within its source
        keep = rank < top
        neighbors = np.zeros((n1, top), dtype=np.int64)
        table = np.zeros((n1, top), dtype=np.float32)
        neighbors[source[keep], rank[keep]] = target[keep]
        table[source[keep], rank[keep]] = weight[keep]
        return cls(neighbors, table, _trend(offsets, items, n1), decay, last)

    def save(self, path: Path) -> None:
        with path.open("wb") as handle:
            np.savez(handle, neighbors=self.neighbors, weights=self.weights, trend=self.trend,
                     decay=np.float64(self.decay), last=np.int64(self.last))

    @classmethod
    def load(cls, path: Path) -> CoocTable:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["neighbors"], z["weights"], z["trend"], float(z["decay"]), int(z["last"]))

    def torch(self) -> TorchCooc:
        n1 = len(self.neighbors)
        found = self.neighbors > 0
        keys = np.nonzero(found)[0].astype(np.int64) * n1 + self.neighbors[found]
        order = np.argsort(keys)
        return TorchCooc(torch.from_numpy(keys[order]), torch.from_numpy(self.weights[found][order].astype(np.float64)),
                         torch.from_numpy(self.trend), self.decay, n1)


def _trend(offsets: np.ndarray, items: np.ndarray, n1: int) -> np.ndarray:
    """log((recent count + 1) / (recent total + n1)) - log((count + 1) / (total + n1)) per item."""
    position_from_end = np.repeat(offsets[1:], np.diff(offsets)) - np.arange(len(items))  # 1 = the user's last
    recent = np.bincount(items[position_from_end <= TREND_POSITIONS], minlength=n1)[:n1].astype(np.float64)
    every = np.bincount(items, minlength=n1)[:n1].astype(np.float64)
    trend = np.log((recent + 1) / (recent.sum() + n1)) - np.log((every + 1) / (every.sum() + n1))
    trend[0] = 0.0
    return trend.astype(np.float32)


@dataclass(frozen=True)
class TorchCooc:
    """The table as sorted pair keys a * n1 + b (for feature look-ups) and the popularity trend."""

    keys: Tensor  # (P,) int64 sorted
    weights: Tensor  # (P,) float64 P(b follows a)
    trend: Tensor  # (n_items + 1,) float32
    decay: float
    n1: int

    def follows(self, source: Tensor, target: Tensor) -> Tensor:
        """P(target follows source), elementwise, float64; 0 for padding, for items added after training
        (ids past the table: `service.system.catalog`) and for pairs outside the table."""
        inside = (source > 0) & (source < self.n1) & (target > 0) & (target < self.n1)
        keys = (torch.where(inside, source, 0) * self.n1 + torch.where(inside, target, 0)).reshape(-1)
        if len(self.keys) == 0:
            return torch.zeros(source.shape, dtype=torch.float64)
        pos = torch.searchsorted(self.keys, keys).clamp(max=len(self.keys) - 1)
        found = (self.keys[pos] == keys) & inside.reshape(-1)
        return torch.where(found, self.weights[pos], torch.zeros_like(self.weights[pos])).reshape(source.shape)


def recent_items(history: np.ndarray, last: int) -> np.ndarray:
    """(B, last) the newest ``last`` items of left-padded (B, T) histories, left-padded with 0."""
    out = np.zeros((len(history), last), dtype=np.int64)
    width = min(last, history.shape[1])
    if width:
        out[:, last - width:] = history[:, history.shape[1] - width:]
    return out


def cooc_top(table: CoocTable, recent: np.ndarray, exclude: list[np.ndarray], k: int) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """(B, k) the source's candidates (0 = none) and scores for (B, L) left-padded recent items.

    exclude: per row, internal ids never to return. Ties go to the smaller item id, so the list
    depends on the row alone, never on the batch it came in.
    """
    b, n_recent = recent.shape
    n1 = len(table.neighbors)
    recent = np.where(recent < n1, recent, 0)  # items added after training (`service.system.catalog`) follow nothing
    decay = table.decay ** np.arange(n_recent - 1, -1, -1, dtype=np.float64)  # newest (last column) weighs 1
    ids = table.neighbors[recent].reshape(b, -1)  # (B, L * TOP)
    weight = (table.weights[recent].astype(np.float64) * decay[None, :, None]).reshape(b, -1)
    keys = np.arange(b, dtype=np.int64)[:, None] * n1 + ids
    # An id past the table (an item added after training) is never a candidate here; keyed, it would ban
    # another row's item (row * n1 + n1 + j is row + 1's item j).
    rows = (np.asarray(e, dtype=np.int64) for e in exclude)
    banned = np.concatenate([row * n1 + e[e < n1] for row, e in enumerate(rows)] or [np.zeros(0, dtype=np.int64)])
    keep = (ids > 0) & ~np.isin(keys, banned)
    unique, inverse = np.unique(keys[keep], return_inverse=True)
    score = np.bincount(inverse, weights=weight[keep], minlength=len(unique))
    row, item = unique // n1, unique % n1
    order = np.lexsort((item, -score, row))
    row, item, score = row[order], item[order], score[order]
    rank = np.arange(len(row)) - np.searchsorted(row, row)
    ok = rank < k
    out_ids, out_scores = np.zeros((b, k), dtype=np.int64), np.zeros((b, k), dtype=np.float64)
    out_ids[row[ok], rank[ok]] = item[ok]
    out_scores[row[ok], rank[ok]] = score[ok]
    return out_ids, out_scores


def quota(depth: int, share: float) -> int:
    """How many of ``depth`` candidate slots the co-occurrence source is offered."""
    return round(share * depth)


def union(retrieved: np.ndarray, retrieved_scores: np.ndarray, cooc: np.ndarray, user: np.ndarray,
          item_vectors: np.ndarray, depth: np.ndarray, share: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge the retriever's list with the co-occurrence list into one list of each row's ``depth``.

    The rule: the retriever's top (depth - q) stay (q = quota(depth, share)); then the co-occurrence
    source's best items not among them, up to q; the slots it cannot fill go back to the retriever's
    next items, in order. No item twice; both lists already honour the exclusion set (the repeat
    policy and the request's exclusions). The merged list is ordered by retrieval score (FAISS's
    score where FAISS returned the item, else the same product of the unit user vector and the item's
    scoring row computed here in float64: the cosine for a cosine model, the unit user times the raw
    item vector for a dot-product one), ties in merge order, so the served order's tie-break and the
    rank features read it as they read the retriever's own list. retrieved: (B, >= depth) ids, 0 =
    none; cooc: (B, K) ids; user: (B, D) unit vectors; item_vectors: (n_items + 1, D) the scoring rows
    (`retriever.artifact.retrieval_rows`). Returns (B, retrieved width) ids (0 = empty) and float32
    scores (0 in empty slots).
    """
    out_ids = np.zeros_like(retrieved)
    out_scores = np.zeros(retrieved.shape, dtype=np.float32)
    for i in range(len(retrieved)):
        n = min(int(depth[i]), retrieved.shape[1])
        q = quota(n, share)
        row, row_scores = retrieved[i, :n], retrieved_scores[i, :n]
        head = row[: n - q][row[: n - q] > 0]
        extra = cooc[i][cooc[i] > 0]
        extra = extra[~np.isin(extra, head)][:q]
        tail = row[n - q:][(row[n - q:] > 0) & ~np.isin(row[n - q:], extra)]
        merged = np.concatenate([head, extra, tail])[:n]
        scores = _retrieval_scores(merged, row, row_scores, user[i], item_vectors)
        order = np.argsort(-scores, kind="stable")
        out_ids[i, : len(merged)] = merged[order]
        out_scores[i, : len(merged)] = scores[order]
    return out_ids, out_scores


def _retrieval_scores(merged: np.ndarray, row: np.ndarray, row_scores: np.ndarray, user: np.ndarray,
                      item_vectors: np.ndarray) -> np.ndarray:
    """FAISS's score for the items FAISS returned, the float64 product with the scoring row rounded to float32 for
    the others."""
    scores = (item_vectors[merged].astype(np.float64) @ user.astype(np.float64)).astype(np.float32)
    where = {int(item): j for j, item in enumerate(row) if item > 0}
    from_faiss = np.array([where.get(int(item), -1) for item in merged], dtype=np.int64)
    return np.where(from_faiss >= 0, row_scores[np.maximum(from_faiss, 0)].astype(np.float32), scores)
