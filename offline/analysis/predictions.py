"""Readable predictions: a few users' recent history and top-k, retriever and reranked order side by side.

Each user is shown at the test point: the history is everything before the test target
(training items and the validation item); the retriever's order is the artifact's FAISS
index under the bundle's repeat policy (as in evaluation: the whole history excluded, or
nothing); the reranked order is the bundle's ranker over the candidates `seqrec evaluate` ranks (the retriever's,
merged with the co-occurrence source's where the ranker was trained on the union), with the features it uses.
The test target is marked wherever it appears.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from offline.data.split import LeaveOneOut
from offline.jobs.evaluate import with_served_sources
from offline.jobs.mine import mine
from offline.jobs.tables import META_COLUMNS, request_times
from ranker.artifact import load_ranker, unit_item_vectors
from ranker.train import FeatureSource, features, make_groups
from retriever.artifact import RetrieverArtifact
from service.system.loader import served_encoder
from service.system.rerank import top_k as served_top_k


def item_metadata(data: PreparedDataset) -> tuple[str | None, list[list[str]]]:
    """The catalogue's metadata column (genres, else attributes; None without one) and each real item's values."""
    column = next((c for c in META_COLUMNS if c in data.items.column_names), None)
    if column is None:
        return None, [[] for _ in range(data.n_items)]
    values = data.items.column(column).to_pylist()
    return column, [[str(v) for v in (x if isinstance(x, list) else [x]) if v is not None] for x in values]


def item_descriptions(data: PreparedDataset) -> list[dict[str, Any]]:
    """Per internal id (0 = padding): external id, a title (the id when the data has none) and a metadata line."""
    columns = data.items.column_names
    titles = data.items.column("title").to_pylist() if "title" in columns else None
    years = data.items.column("year").to_pylist() if "year" in columns else None
    meta_column, metas = item_metadata(data)
    out: list[dict[str, Any]] = [{"id": "", "title": "(padding)", "meta": ""}]
    for i, item_id in enumerate(data.item_ids[1:]):
        title = (titles[i] if titles and titles[i] else None) or f"item {item_id}"
        if years and years[i]:
            title = f"{title} ({years[i]})"
        out.append({"id": str(item_id), "title": title,
                    "meta": f"{meta_column}: {', '.join(metas[i])}" if metas[i] else ""})
    return out


def pick_users(data: PreparedDataset, n: int, seed: int, user_ids: Sequence[str] = ()) -> np.ndarray:
    """User rows: those named by external id, else ``n`` drawn at random (seeded), in row order."""
    if user_ids:
        where = {str(u): row for row, u in enumerate(data.user_ids)}
        missing = [u for u in user_ids if u not in where]
        if missing:
            raise SeqrecError(f"unknown user id(s) in {data.path}: {', '.join(missing[:5])}")
        return np.array([where[u] for u in user_ids], dtype=np.int64)
    n = min(n, data.n_users)
    return np.sort(np.random.default_rng(seed).choice(data.n_users, size=n, replace=False))


def top_k(artifact: RetrieverArtifact, split: LeaveOneOut, rows: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """{"retriever": (U, k) ids from the index, and "reranked": (U, k) when the bundle holds a ranker}; 0 = empty."""
    if artifact.index is None:
        raise SeqrecError(f"{artifact.path}: readable predictions need the artifact's index")
    ranker = load_ranker(artifact.path, artifact.manifest)
    depth = max(k, ranker.depth) if ranker is not None else k
    inputs = split.inputs("test")
    encode = served_encoder(artifact, threads=torch.get_num_threads())
    mined = mine(encode, artifact.index, inputs.items, inputs.offsets[:-1][rows], inputs.offsets[1:][rows],
                 split.test_targets[rows], depth=depth, max_len=artifact.max_len,
                 exclude_seen=artifact.manifest.exclude_seen, desc="predictions")
    out = {"retriever": mined.candidates[:, :k]}
    if ranker is not None:
        with torch.inference_mode():
            vectors = unit_item_vectors(artifact.model.item_vectors().detach())
        source = FeatureSource(ranker.tables.torch(), vectors, ranker.extras)
        at, last_event = request_times(split, "test", mined) if ranker.needs_time else (None, None)
        groups = with_served_sources(make_groups(mined, inputs.items, artifact.max_len, at=at, last_event=last_event),
                                     inputs.items, artifact, ranker, vectors)
        with torch.inference_mode():
            scores = ranker.ranker.score(features(source, groups, np.arange(len(rows))))  # (U, depth)
        reranked = np.zeros((len(rows), k), dtype=groups.mined.candidates.dtype)
        for i, (row_scores, candidates) in enumerate(zip(scores.numpy(), groups.mined.candidates, strict=True)):
            best = candidates[served_top_k(row_scores, candidates, k)]  # the served order (`service.system.rerank`)
            reranked[i, : len(best)] = best
        out["reranked"] = reranked
    return out


def readable_predictions(artifacts: Mapping[str, RetrieverArtifact], data: PreparedDataset, rows: np.ndarray, *,
                         k: int = 10, recent: int = 10) -> list[dict[str, Any]]:
    """One record per user: recent history, the test target and each model's top-k lists."""
    if len(rows) == 0:
        return []
    split = data.split()
    described = item_descriptions(data)
    lists = {label: top_k(artifact, split, rows, k) for label, artifact in artifacts.items()}
    inputs = split.inputs("test")
    out = []
    for i, row in enumerate(rows.tolist()):
        target = int(split.test_targets[row])
        history = inputs.row(row)
        out.append({
            "user_id": str(data.user_ids[row]), "history_length": len(history),
            "recent_history": [described[int(item)] for item in history[-recent:]],
            "target": described[target],
            "lists": {label: {order: [{**described[int(item)], "is_target": int(item) == target}
                                      for item in ids[i] if item != 0]
                              for order, ids in by_order.items()}
                      for label, by_order in lists.items()},
        })
    return out
