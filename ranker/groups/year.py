"""Base: the candidate's year bucket and its distance to the history's mean bucket (0 when unknown)."""

from __future__ import annotations

import numpy as np

from ranker.groups import Columns, FeatureGroup, Inputs, register


def _compute(x: Inputs) -> Columns:
    t = x.item_arrays()
    years = t.year_bucket[x.candidates].astype(np.float32)  # (B, N)
    hist_years = t.year_bucket[x.history].astype(np.float32) * x.hist_valid
    known_years = (hist_years > 0).sum(1)
    mean_year = hist_years.sum(1, dtype=np.float32) / np.maximum(known_years, 1).astype(np.float32)  # (B,)
    return {"year_bucket": years,
            "year_distance": np.where((years > 0) & (known_years[:, None] > 0), np.abs(years - mean_year[:, None]),
                                      np.float32(0))}


GROUP = register(FeatureGroup(
    "year", ("year_bucket", "year_distance"), _compute, base=60,
    doc="the candidate's year bucket (0 = unknown); |its bucket - the history's mean bucket|, 0 when unknown"))
