"""Streamed full-ranking evaluation of any scorer on a leave-one-out split.

Every function follows a repeat policy (retriever/repeats.py) through ``exclude_seen``:
True (exclude) removes the user's whole history from the ranking, the target included when
it is a repeat, so a repeat target is unreachable and gets the worst rank (n_items + 1, a miss
at every cut-off); False (allow) removes nothing, and history items are ranked on their merit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from common.metrics import mean_metrics
from offline.data.sequences import Sequences
from offline.data.split import LeaveOneOut, Split
from offline.evaluation.metrics import pessimistic_ranks

if TYPE_CHECKING:
    from offline.data.temporal import TemporalSplit

# (B, T) left-padded histories (int64, 0 = padding) -> (B, n_items + 1) scores.
Scorer = Callable[[Tensor], Tensor]
# (B, T) left-padded histories -> (B, D) float32 user (query) vectors.
Encoder = Callable[[Tensor], Tensor]

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
    exclude_seen: bool = True,
    desc: str = "evaluate",
) -> np.ndarray:
    """(n_users,) pessimistic rank of each user's target among all items.

    exclude_seen: the whole history is excluded (even when the scorer sees only its last max_len
    items) and a repeat target is a miss; otherwise nothing is.
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
            batch_targets = torch.from_numpy(targets[rows]).long()
            if not exclude_seen:
                ranks[rows] = pessimistic_ranks(scores.float(), batch_targets).numpy()
                continue
            exclude = torch.zeros(scores.shape, dtype=torch.bool).scatter_(1, history, True)
            batch_ranks = pessimistic_ranks(scores.float(), batch_targets, exclude)
            repeat = exclude.gather(1, batch_targets[:, None]).squeeze(1)
            ranks[rows] = torch.where(repeat, n_items + 1, batch_ranks).numpy()
    return ranks


def chunked_target_ranks(
    encode: Encoder,
    items: Tensor,
    inputs: Sequences,
    targets: np.ndarray,
    *,
    scale: float = 1.0,
    batch_size: int = 1024,
    item_chunk: int | None = None,
    max_len: int | None = None,
    exclude_seen: bool = True,
    desc: str = "evaluate",
) -> np.ndarray:
    """The ranks of :func:`target_ranks` for a scorer ``encode(h) @ items.T / scale``, streamed over items too.

    items: (n_items + 1, D) scoring vectors, row 0 padding. Each user batch walks the catalogue in
    blocks of ``item_chunk`` rows and only counts, per block, the items scoring at least the target
    (history, padding and the target itself left out), so memory stays at one (batch, item_chunk)
    block whatever the catalogue size. Each target's score is read from the same kind of block
    product as the scores it is compared with, so exact ties still count against the target.
    """
    n_rows, device = items.shape[0], items.device
    item_chunk = item_chunk or max(1, _BATCH_BYTES // (batch_size * (4 + 1)))
    ranks = np.empty(len(inputs), dtype=np.int64)
    order = length_order(inputs)
    with torch.inference_mode():
        for start in tqdm(range(0, len(inputs), batch_size), desc=desc, unit="batch", disable=None, leave=False):
            rows = order[start : start + batch_size]
            history = torch.from_numpy(inputs.padded(rows)).to(device)
            users = encode(history if max_len is None else history[:, -max_len:]).float().to(device)
            target = torch.from_numpy(targets[rows]).long().to(device)
            if len(target) and (int(target.min()) < 1 or int(target.max()) >= n_rows):
                raise ValueError(f"targets must be internal ids in [1, {n_rows - 1}] (0 is padding)")
            removed = history if exclude_seen else history[:, :0]
            ahead = _count_ahead(users, items, removed, target, scale=scale, item_chunk=item_chunk)
            batch_ranks = ahead.long() + 1
            if exclude_seen:
                batch_ranks[(history == target[:, None]).any(1)] = n_rows  # a repeat target: unreachable
            ranks[rows] = batch_ranks.cpu().numpy()
    return ranks


def _block_target_scores(users: Tensor, items: Tensor, target: Tensor, *, scale: float, item_chunk: int) -> Tensor:
    """(B,) each target's score, read from the very product the counting pass computes for its block (same
    shapes, so the same kernel and rounding): a separately computed dot product can differ in the last bit
    and turn exact ties into wins."""
    owner = torch.div(target, item_chunk, rounding_mode="floor")
    target_score = torch.empty(len(target), device=users.device)
    for chunk in owner.unique().tolist():
        lo = chunk * item_chunk
        sel = owner == chunk
        block = users @ items[lo : lo + item_chunk].T / scale
        target_score[sel] = block[sel].gather(1, (target[sel] - lo)[:, None]).squeeze(1)
    return target_score


def _count_ahead(users: Tensor, items: Tensor, history: Tensor, target: Tensor, *, scale: float,
                 item_chunk: int) -> Tensor:
    """(B,) int32: per user, the items scoring at least the target, ``history`` (the removed items: (B, T),
    possibly T = 0), padding and the target left out."""
    n_rows, device = items.shape[0], users.device
    several = n_rows > item_chunk
    target_score = _block_target_scores(users, items, target, scale=scale, item_chunk=item_chunk) if several \
        else None
    ahead = torch.zeros(len(target), dtype=torch.int32, device=device)
    for lo in range(0, n_rows, item_chunk):
        block = users @ items[lo : lo + item_chunk].T / scale  # (B, C)
        if block.numel() and torch.isnan(block.amax()):
            raise ValueError("scores contain NaN; a NaN cannot be ranked")
        if target_score is None:  # one block: the target's score is in it
            target_score = block.gather(1, target[:, None]).squeeze(1)
        width = block.shape[1]
        spare = torch.zeros(len(target), 1, dtype=torch.bool, device=device)
        hit = torch.cat([block >= target_score[:, None], spare], 1)
        # Removed from this block: padding (column 0 of the first), the history and the target; ids
        # outside the block point at the spare last column, which is dropped.
        removed = torch.cat([history, target[:, None]], 1) - lo
        removed = torch.where((removed >= 0) & (removed < width), removed, width)
        hit.scatter_(1, removed, False)
        if lo == 0:
            hit[:, 0] = False
        ahead += hit[:, :width].sum(dim=1, dtype=torch.int32)
    return ahead


def evaluate_vectors(
    encode: Encoder,
    items: Tensor,
    data: LeaveOneOut | TemporalSplit,
    *,
    scale: float = 1.0,
    splits: Sequence[Split] = ("valid", "test"),
    ks: Sequence[int] = EVAL_KS,
    batch_size: int | None = None,
    max_len: int | None = None,
    exclude_seen: bool = True,
) -> dict[str, dict[str, float]]:
    """:func:`evaluate_splits` for a vector model (scores = user . item / scale), streamed over items."""
    return _per_split(data, splits, ks, lambda inputs, targets, split: chunked_target_ranks(
        encode, items, inputs, targets, scale=scale, batch_size=batch_size or 1024, max_len=max_len,
        exclude_seen=exclude_seen, desc=split))


def _per_split(data: LeaveOneOut | TemporalSplit, splits: Sequence[Split], ks: Sequence[int],
               ranks_of: Callable[[Sequences, np.ndarray, Split], np.ndarray]) -> dict[str, dict[str, float]]:
    """{"valid": {...}, "test": {...}}: ``ranks_of(inputs, targets, split)`` summarised per split."""
    return {split: summarize(ranks_of(data.inputs(split), data.targets(split), split), ks) for split in splits}


def summarize(ranks: np.ndarray, ks: Sequence[int] = EVAL_KS) -> dict[str, float]:
    return {name: round(value, 6) for name, value in mean_metrics(ranks, ks).items()}


def evaluate_splits(
    scorer: Scorer,
    data: LeaveOneOut,
    n_items: int,
    *,
    splits: Sequence[Split] = ("valid", "test"),
    ks: Sequence[int] = EVAL_KS,
    batch_size: int | None = None,
    max_len: int | None = None,
    exclude_seen: bool = True,
) -> dict[str, dict[str, float]]:
    """{"valid": {...}, "test": {...}} metric means for the scorer."""
    return _per_split(data, splits, ks, lambda inputs, targets, split: target_ranks(
        scorer, inputs, targets, n_items, batch_size=batch_size, max_len=max_len, exclude_seen=exclude_seen,
        desc=split))


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
    exclude_seen: bool = True,
    desc: str = "index",
) -> np.ndarray:
    """Ranks as a served model sees them: the index's top ``depth`` after removing the history
    (``exclude_seen``, a repeat target included) or nothing.

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
            exclude = [h[h != 0] - 1 if exclude_seen else h[:0] for h in history]
            scores, found = search(index, queries.float().cpu().numpy(), depth, exclude=exclude)
            target_rows = batch_targets[:, None] - 1
            hit = found == target_rows  # (B, depth)
            target_score = np.where(hit, scores, np.inf).min(axis=1, keepdims=True)
            batch_ranks = (scores >= target_score).sum(axis=1)
            ranks[rows] = np.where(hit.any(axis=1), batch_ranks, n_items + 1)
    return ranks
