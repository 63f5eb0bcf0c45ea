"""Streamed full-ranking evaluation of any scorer on a leave-one-out split."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from offline.metrics import metrics_from_ranks, pessimistic_ranks
from offline.sequences import Sequences
from offline.split import LeaveOneOut, Split

# (B, T) left-padded histories (int64, 0 = padding) -> (B, n_items + 1) scores.
Scorer = Callable[[Tensor], Tensor]

EVAL_KS = (1, 5, 10, 20, 50)
_BATCH_BYTES = 256 * 2**20  # score matrix + masks per batch stay around this size


def default_batch_size(n_items: int, limit: int = 1024) -> int:
    # One float32 score matrix plus two bool masks of the same shape per batch.
    per_user = (n_items + 1) * (4 + 1 + 1)
    return max(1, min(limit, _BATCH_BYTES // per_user))


def length_order(inputs: Sequences) -> np.ndarray:
    """Users sorted by history length, so each batch is padded only to similar lengths
    (on short-history data such as Beauty this cuts the encoder's work several times)."""
    return np.argsort(inputs.lengths, kind="stable")


def target_ranks(
    scorer: Scorer,
    inputs: Sequences,
    targets: np.ndarray,
    n_items: int,
    *,
    batch_size: int | None = None,
    max_len: int | None = None,
    desc: str = "evaluate",
) -> np.ndarray:
    """(n_users,) pessimistic rank of each user's target among all items, history excluded.

    The whole history is excluded even when the scorer sees only its last max_len items.
    """
    batch_size = batch_size or default_batch_size(n_items)
    ranks = np.empty(len(inputs), dtype=np.int64)
    order = length_order(inputs)
    starts = range(0, len(inputs), batch_size)
    with torch.inference_mode():
        for start in tqdm(starts, desc=desc, unit="batch", disable=None, leave=False):
            rows = order[start : start + batch_size]
            history = torch.from_numpy(inputs.padded(rows))
            scores = scorer(history if max_len is None else history[:, -max_len:])
            exclude = torch.zeros(scores.shape, dtype=torch.bool).scatter_(1, history, True)
            batch_targets = torch.from_numpy(targets[rows]).long()
            ranks[rows] = pessimistic_ranks(scores.float(), batch_targets, exclude).numpy()
    return ranks


def summarize(ranks: np.ndarray, ks: Sequence[int] = EVAL_KS) -> dict[str, float]:
    values = metrics_from_ranks(torch.from_numpy(ranks), ks)
    return {name: round(float(v.mean()), 6) for name, v in values.items()}


def evaluate_splits(
    scorer: Scorer,
    data: LeaveOneOut,
    n_items: int,
    *,
    splits: Sequence[Split] = ("valid", "test"),
    ks: Sequence[int] = EVAL_KS,
    batch_size: int | None = None,
    max_len: int | None = None,
) -> dict[str, dict[str, float]]:
    """{"valid": {...}, "test": {...}} metric means for the scorer."""
    out: dict[str, dict[str, float]] = {}
    for split in splits:
        ranks = target_ranks(
            scorer, data.inputs(split), data.targets(split), n_items,
            batch_size=batch_size, max_len=max_len, desc=split,
        )
        out[split] = summarize(ranks, ks)
    return out


# (B, T) left-padded histories -> (B, D) float32 query vectors for the index.
Encoder = Callable[[Tensor], Tensor]


def index_target_ranks(
    encode: Encoder,
    index: Any,
    inputs: Sequences,
    targets: np.ndarray,
    n_items: int,
    *,
    depth: int,
    batch_size: int = 1024,
    max_len: int | None = None,
    desc: str = "index",
) -> np.ndarray:
    """Ranks as a served model sees them: the index's top ``depth`` after removing the history.

    Row r of the index is internal item r + 1. A target outside the top ``depth`` gets rank
    n_items + 1, so metrics at cut-offs up to ``depth`` equal the full-ranking ones whenever
    the index is exact. Ties among returned items count against the target.
    """
    from retriever.index import search

    ranks = np.empty(len(inputs), dtype=np.int64)
    order = length_order(inputs)
    with torch.inference_mode():
        for start in tqdm(range(0, len(inputs), batch_size), desc=desc, unit="batch", disable=None, leave=False):
            rows = order[start : start + batch_size]
            history = inputs.padded(rows)
            queries = encode(torch.from_numpy(history if max_len is None else history[:, -max_len:]))
            batch_targets = targets[rows]
            # As in full ranking: the history is removed, the target never is (even when it is a repeat).
            exclude = [h[(h != 0) & (h != t)] - 1 for h, t in zip(history, batch_targets, strict=True)]
            scores, found = search(index, queries.float().cpu().numpy(), depth, exclude=exclude)
            target_rows = batch_targets[:, None] - 1
            hit = found == target_rows  # (B, depth)
            target_score = np.where(hit, scores, np.inf).min(axis=1, keepdims=True)
            batch_ranks = (scores >= target_score).sum(axis=1)
            ranks[rows] = np.where(hit.any(axis=1), batch_ranks, n_items + 1)
    return ranks
