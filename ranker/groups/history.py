"""Base: the request's history length."""

from __future__ import annotations

import numpy as np

from ranker.groups import Columns, FeatureGroup, Inputs, log1p32, register


def _compute(x: Inputs) -> Columns:
    return {"history_length": log1p32(x.hist_len.astype(np.float32))[:, None]}


GROUP = register(FeatureGroup("history", ("history_length",), _compute, base=50, doc="log1p of the history length"))
