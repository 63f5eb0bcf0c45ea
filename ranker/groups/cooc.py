"""Optional: the co-occurrence table's view of each candidate (`ranker.cooc`: P(candidate follows the newest
history items), its rank among the candidates, and the item's popularity trend)."""

from __future__ import annotations

import torch

from ranker.cooc import COOC_FILE, CoocTable
from ranker.groups import Columns, FeatureGroup, Inputs, TableKind, register, register_table

WINDOWS = {"cooc_last1": 1, "cooc_last3": 3, "cooc_last10": 10}  # recency-weighted sums over the newest k
NOT_FOUND = -1.0  # the sentinel of a rank feature when the source does not hold the candidate

TABLE = register_table(TableKind("cooc", COOC_FILE, lambda offsets, items, _times, n: CoocTable.build(offsets, items,
                                                                                                        n),
                                 CoocTable.load, lambda table: table.torch()))


def _compute(x: Inputs) -> Columns:
    """Every column in float64 and rounded once by the caller, so a user's value does not depend on the batch."""
    cooc = x.tables["cooc"]
    history, candidates = x.history_t, x.candidates_t
    b, n = candidates.shape
    width = max(WINDOWS.values())
    recent = torch.zeros(b, width, dtype=history.dtype)
    take = min(width, history.shape[1])
    recent[:, width - take:] = history[:, history.shape[1] - take:]
    weight = cooc.follows(recent[:, None, :].expand(b, n, width), candidates[:, :, None].expand(b, n, width))
    decay = cooc.decay ** torch.arange(width - 1, -1, -1, dtype=torch.float64)  # newest weighs 1
    weighted = weight * decay  # (B, N, W)
    columns = {name: weighted[..., -size:].sum(-1) for name, size in WINDOWS.items()}
    source = columns["cooc_last10"].float().masked_fill(x.unknown_t, 0.0)
    higher = (source[:, None, :] > source[:, :, None]).sum(-1)  # (B, N) candidates scoring above
    columns["cooc_rank"] = torch.where(source > 0, torch.log1p(higher.float()), torch.full_like(source, NOT_FOUND))
    trend = cooc.trend
    inside = candidates < len(trend)  # items added after training have no trend
    columns["popularity_trend"] = torch.where(inside, trend[torch.where(inside, candidates, 0)], 0.0)
    return columns


GROUP = register(FeatureGroup(
    "cooc", ("cooc_last1", "cooc_last3", "cooc_last10", "cooc_rank", "popularity_trend"), _compute,
    tables=("cooc",), id_derived=tuple(WINDOWS),
    doc="P(candidate follows the newest history item); recency-weighted sums over the newest 3 and 10 (the "
        "co-occurrence source's own score); log1p(candidates with a higher cooc_last10), -1 when it is 0; log "
        "share among users' last training items over share among all training items"))
