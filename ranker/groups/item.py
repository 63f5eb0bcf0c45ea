"""Base: the candidate itself (its training popularity, and whether its ID can be trusted)."""

from __future__ import annotations

from ranker.groups import Columns, FeatureGroup, Inputs, register


def _compute(x: Inputs) -> Columns:
    return {"popularity": x.item_arrays().popularity[x.candidates], "is_unknown": x.unknown}


GROUP = register(FeatureGroup(
    "item", ("popularity", "is_unknown"), _compute, base=20,
    doc="log1p(training count) / log1p(max count); 1 for an item whose ID is not trusted"))
