"""The retriever's inputs from CSR sequences: left-padded histories (for encoding: serving, mining,
evaluation) and fixed-width training windows -> shuffled batches.

Windows are cut from arrays of training positions only (no validation or test item), so this
module knows nothing about files or splits. The training loop owns the per-epoch shuffle: its
generator is part of the ``--resume`` checkpoint, so an interrupted run draws the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor


def padded_slices(items: np.ndarray, start: np.ndarray, end: np.ndarray, max_len: int | None = None) -> np.ndarray:
    """(G, T) left-padded items[start:end] per row, keeping the last ``max_len``."""
    if max_len is not None:
        start = np.maximum(start, end - max_len)
    lengths = end - start
    width = max(int(lengths.max()) if len(lengths) else 0, 1)
    cols = np.arange(width)
    shift = width - lengths
    valid = cols[None, :] >= shift[:, None]
    source = start[:, None] + cols[None, :] - shift[:, None]
    out = np.zeros((len(start), width), dtype=np.int64)
    out[valid] = items[source[valid]]
    return out


def length_groups(lengths: np.ndarray, call_cost: int) -> list[tuple[int, int]]:
    """Split ascending ``lengths`` into runs [start, end) that minimise the encoder's cost, modelled as
    ``call_cost`` per run plus (rows x longest length) per run: an exact dynamic programme over the cut points.
    Only a change of length can be a cut worth making, so a batch of any size costs at most (distinct
    lengths)^2 steps, a few hundred for a micro-batch. The compiled encoder (`retriever.compiled.OnnxEncoder`)
    and the ranker's history cosines (`ranker.features`) run left-padded batches so."""
    values, counts = np.unique(np.maximum(np.asarray(lengths, dtype=np.int64), 1), return_counts=True)
    ends = [0, *np.cumsum(counts).tolist()]  # ends[j]: rows shorter than or as long as values[j - 1]
    sizes = values.tolist()
    best = [0] * len(ends)
    cut = [0] * len(ends)
    for j in range(1, len(ends)):  # plain ints: these few hundred steps cost less than numpy's calls
        size, rows = sizes[j - 1], ends[j]
        best[j], cut[j] = min((best[i] + call_cost + (rows - ends[i]) * size, i) for i in range(j))
    groups = []
    j = len(ends) - 1
    while j > 0:
        groups.append((ends[cut[j]], ends[j]))
        j = cut[j]
    return groups[::-1]


def row_groups(ids: np.ndarray, call_cost: int) -> list[tuple[slice | np.ndarray, int]]:
    """How to run a (B, T) left-padded batch (0 = padding) in groups of similar history length: (rows, first
    column) pairs, each group's rows to be run as ``ids[rows, first:]``, cut to its longest history by
    `length_groups`. A lone history, a batch whose histories all fill the width, or one whose padding costs
    less than another call is one group of every row (a slice: no copies)."""
    n, width = ids.shape
    if n < 2 or ids[:, 0].all():
        return [(slice(None), 0)]
    lengths = np.count_nonzero(ids, axis=1)
    longest = int(lengths.max())
    if (longest - int(lengths.min())) * n <= call_cost:
        return [(slice(None), max(width - max(longest, 1), 0))]
    order = np.argsort(lengths, kind="stable")
    groups = length_groups(lengths[order], call_cost)
    if len(groups) == 1:
        return [(slice(None), max(width - max(longest, 1), 0))]
    return [(order[start:end], max(width - max(int(lengths[order[end - 1]]), 1), 0)) for start, end in groups]


def make_windows(offsets: np.ndarray, items: np.ndarray, max_len: int, mode: str = "all") -> np.ndarray:
    """(n_windows, max_len + 1) left-padded training windows.

    A window of w items trains w - 1 next-item targets. "all" cuts sequences longer than
    max_len + 1 from the end into windows that overlap by one item, so every training
    target is predicted exactly once; "last" keeps only each user's most recent window;
    "prefixes" ends one window at every training target (its last item, with up to max_len
    items before it), for encoders trained at the last position only (see ``prefix_windows``).
    """
    if mode == "prefixes":
        return prefix_windows(offsets, items, max_len)
    lengths = np.diff(offsets)
    keep = lengths >= 2
    ends, lengths = offsets[1:][keep], lengths[keep]
    n_windows = np.ones_like(lengths) if mode == "last" else -(-(lengths - 1) // max_len)  # ceil
    user = np.repeat(np.arange(len(lengths)), n_windows)
    back = np.arange(n_windows.sum()) - np.repeat(np.cumsum(n_windows) - n_windows, n_windows)  # 0 = latest
    window_ends = ends[user] - back * max_len
    window_starts = np.maximum(window_ends - (max_len + 1), offsets[1:][keep][user] - lengths[user])
    width = max_len + 1
    size = window_ends - window_starts
    cols = np.arange(width)
    shift = width - size
    valid = cols[None, :] >= shift[:, None]  # (n_windows, width)
    source = window_starts[:, None] + cols[None, :] - shift[:, None]
    out = np.zeros((len(size), width), dtype=np.int64)
    out[valid] = items[source[valid]]
    return out


def prefix_windows(offsets: np.ndarray, items: np.ndarray, max_len: int) -> np.ndarray:
    """(n_targets, max_len + 1) left-padded windows, one per training target: items[max(start, t - max_len) : t + 1]
    for every position t after a sequence's first. Each target is trained once, at the window's last position,
    with its full history: what encoders whose states are not causal (BSARec) need, at about the mean
    sequence length times the cost of "all"."""
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    n_targets = np.maximum(lengths - 1, 0)
    user = np.repeat(np.arange(len(lengths)), n_targets)
    rank = np.arange(n_targets.sum()) - np.repeat(np.cumsum(n_targets) - n_targets, n_targets)
    target = starts[user] + 1 + rank  # absolute index of each window's last item
    windows = padded_slices(items, np.maximum(starts[user], target - max_len), target + 1)
    return np.pad(windows, ((0, 0), (max_len + 1 - windows.shape[1], 0)))


def batches(windows: Tensor, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Shuffled batches, each trimmed to its longest window.

    Windows are sorted by length inside random chunks of 50 batches, so a batch holds
    similar lengths (far less padding on short-sequence data) and stays random across epochs.
    """
    device = generator.device  # the windows' device: a CUDA generator draws CUDA permutations
    order = torch.randperm(len(windows), generator=generator, device=device)
    lengths = (windows[order] != 0).sum(1)
    chunk = batch_size * 50
    parts = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        parts.append(part[torch.argsort(lengths[start : start + chunk], descending=True, stable=True)])
    sorted_order = torch.cat(parts)
    starts = torch.arange(0, len(sorted_order), batch_size, device=device)
    for start in starts[torch.randperm(len(starts), generator=generator, device=device)].tolist():
        rows = windows[sorted_order[start : start + batch_size]]
        width = int((rows != 0).sum(1).max())
        yield rows[:, -width:]
