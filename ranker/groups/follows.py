"""Base: how often the candidate followed the newest history items in training (`ranker.tables` pair counts)."""

from __future__ import annotations

import numpy as np

from ranker.groups import Columns, FeatureGroup, Inputs, log1p32, register
from ranker.tables import PAIR_WINDOW, RECENT

COLUMNS = ("follows_last", "follows_last_share", "follows_recent")


def _compute(x: Inputs) -> Columns:
    t = x.item_arrays()
    recent_items = x.history[:, -RECENT:]  # (B, R)
    counts = t.follows(recent_items[:, None, :], x.candidates[:, :, None])  # (B, N, R) float32
    follows_last = counts[..., -1]
    last_total = t.follow_totals[x.history[:, -1]]  # (B,)
    return {"follows_last": log1p32(follows_last),
            "follows_last_share": follows_last / np.maximum(last_total, np.float32(1))[:, None],
            "follows_recent": log1p32(counts.sum(-1, dtype=np.float32))}


GROUP = register(FeatureGroup(
    "follows", COLUMNS, _compute, base=70, id_derived=COLUMNS,
    doc=f"log1p(times the candidate followed the last history item within {PAIR_WINDOW} steps); that count / times "
        f"the last item was followed by anything; log1p(the counts summed over the last {RECENT} items)"))
