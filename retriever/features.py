"""Item side-feature ids (``model.item_features``) from a catalogue column, numbered the one way that training,
warm starts and the service's catalogue changes all share: the column's distinct values, sorted, get ids 1..V
(0 = none)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def value_lists(values: Sequence[Any]) -> list[list[str]]:
    """Each catalogue cell (a list, a scalar or None) as a list of strings."""
    return [[str(v) for v in (x if isinstance(x, list) else [x]) if v is not None] for x in values]


def feature_vocabulary(values: Sequence[Any]) -> dict[str, int]:
    """value -> feature id (1..V) for a catalogue column's cells."""
    return {v: i + 1 for i, v in enumerate(sorted({v for row in value_lists(values) for v in row}))}


def feature_rows(values: Sequence[Any], vocabulary: dict[str, int], width: int) -> np.ndarray:
    """(len(values), width) int64 feature ids of each cell, 0-padded; values outside ``vocabulary`` are dropped
    (a new item's unseen brand has no trained embedding) and a row is cut at ``width``."""
    out = np.zeros((len(values), max(1, width)), dtype=np.int64)
    for i, row in enumerate(value_lists(values)):
        ids = [vocabulary[v] for v in row if v in vocabulary][: out.shape[1]]
        out[i, : len(ids)] = ids
    return out
