"""Optional: the candidate's metadata values (genres, attributes) held by the newest history items."""

from __future__ import annotations

import numpy as np

from ranker.groups import Columns, FeatureGroup, Inputs, register

META_RECENT = 3


def _compute(x: Inputs) -> Columns:
    """The share of each candidate's metadata values held by the newest history item, and by any of the newest
    META_RECENT (0 without values)."""
    t = x.item_arrays()
    meta = x.meta  # (B, N, M) value ids, 0 = none
    has = np.maximum((meta != 0).sum(-1), 1).astype(np.float32)  # (B, N)
    newest = x.history[:, -META_RECENT:]
    recent = t.meta[newest] * (newest != 0)[..., None]  # (B, R, M); padding holds no value
    held = meta[:, :, :, None, None] == recent[:, None, None, :, :]  # (B, N, M, R, M)
    held &= (meta != 0)[..., None, None]
    by_item = held.any(-1)  # (B, N, M, R): value m of the candidate is among item r's values
    last = by_item[..., -1].sum(-1).astype(np.float32) / has
    anywhere = by_item.any(-1).sum(-1).astype(np.float32) / has
    return {"meta_last": last, "meta_recent": anywhere}


GROUP = register(FeatureGroup(
    "recent_meta", ("meta_last", "meta_recent"), _compute,
    doc=f"share of the candidate's metadata values that the newest history item has; that any of the newest "
        f"{META_RECENT} has"))
