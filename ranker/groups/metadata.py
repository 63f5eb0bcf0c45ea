"""Base: how the candidate's metadata values (genres, attributes) meet the history's."""

from __future__ import annotations

import numpy as np
import torch

from ranker.groups import Columns, FeatureGroup, Inputs, register


def _compute(x: Inputs) -> Columns:
    t = x.item_arrays()
    meta = x.meta  # (B, N, M)
    b, n, m = meta.shape
    hist_len = x.hist_len
    hist_meta = t.meta[x.history] * x.hist_valid[..., None]  # (B, T, M)
    width = t.n_meta + 1
    keys = (np.arange(b)[:, None] * width + hist_meta.reshape(b, -1)).reshape(-1)
    counts = np.bincount(keys, minlength=b * width).reshape(b, width).astype(np.float32)
    counts[:, 0] = 0  # value id 0 = none
    found = np.take_along_axis(counts, meta.reshape(b, n * m), 1).reshape(b, n, m)  # history count per value
    has = np.maximum((meta != 0).sum(-1), 1).astype(np.float32)  # (B, N)
    share = found / hist_len.astype(np.float32)[:, None, None]
    # torch's float32 sum (numpy's pairwise sum rounds differently, and trained rankers saw torch's values)
    return {"meta_overlap": (found > 0).sum(-1).astype(np.float32) / has,
            "meta_affinity": torch.from_numpy(share).sum(-1).numpy() / has}


GROUP = register(FeatureGroup(
    "metadata", ("meta_overlap", "meta_affinity"), _compute, base=40,
    doc="share of the candidate's metadata values present in the history; their mean frequency there"))
