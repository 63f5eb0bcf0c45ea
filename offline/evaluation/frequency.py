"""The personal-frequency baseline (retriever/frequency.py) under either protocol: its decay chosen on validation.

Each decay of the grid is scored on the validation targets; the best validation NDCG@10 wins (the first of the
grid on a tie, so plain counts unless recency helps), and only that one scores the test targets. The back-off's
counts come from training positions only (under the temporal protocol with refit: everything before the test
cut for the test window, as the popularity baseline's). Under the exclude repeat policy every decay gives the
same ranking (the history is removed; popularity orders the rest), so counts are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from offline.data.prepared import PreparedDataset
from offline.data.temporal import TemporalProtocol, repeat_shares
from offline.evaluation.evaluate import EVAL_KS, evaluate_splits
from offline.evaluation.temporal import scorer_ranks, temporal_metrics
from retriever.frequency import DECAYS, PersonalFrequency
from retriever.repeats import resolve_repeats

SELECT_BY = "NDCG@10"


def _chosen(valid: dict[float, dict[str, float]]) -> float:
    return max(valid, key=lambda decay: valid[decay][SELECT_BY])  # max keeps the first of equal ones


def evaluate_frequency(data: PreparedDataset, *, repeats: str = "auto", decays: Sequence[float] = DECAYS,
                       ks: tuple[int, ...] = EVAL_KS, batch_size: int | None = None) -> dict[str, Any]:
    """Leave-one-out: {"repeats", "decay", "valid_by_decay", "valid", "test"}."""
    split = data.split()
    policy = resolve_repeats(repeats, data.repeat_shares["valid"])
    exclude_seen = policy == "exclude"
    grid = decays[:1] if exclude_seen else decays
    valid = {decay: evaluate_splits(PersonalFrequency.fit(split.train.items, data.n_items, decay).score, split,
                                    data.n_items, splits=("valid",), ks=ks, batch_size=batch_size,
                                    exclude_seen=exclude_seen)["valid"] for decay in grid}
    decay = _chosen(valid)
    model = PersonalFrequency.fit(split.train.items, data.n_items, decay)
    test = evaluate_splits(model.score, split, data.n_items, splits=("test",), ks=ks, batch_size=batch_size,
                           exclude_seen=exclude_seen)["test"]
    return {"repeats": policy, "decay": decay, "valid_by_decay": _by_decay(valid), "valid": valid[decay],
            "test": test}


def evaluate_frequency_temporal(data: PreparedDataset, protocol: TemporalProtocol, *, repeats: str = "auto",
                                decays: Sequence[float] = DECAYS, ks: tuple[int, ...] = EVAL_KS,
                                batch_size: int | None = None) -> dict[str, Any]:
    """The temporal split: the decay chosen on the validation window, then the test window read once."""
    split = protocol.split_data(data)
    shares = repeat_shares(split)
    policy = resolve_repeats(repeats, shares["valid"])
    exclude_seen = policy == "exclude"
    grid = decays[:1] if exclude_seen else decays
    by_decay = {}
    for decay in grid:
        ranks = scorer_ranks(PersonalFrequency.fit(split.train.items, data.n_items, decay).score, data.n_items,
                             exclude_seen=exclude_seen, batch_size=batch_size)
        by_decay[decay] = temporal_metrics(split, ranks, ("valid",), ks)
    decay = _chosen({d: r["valid"] for d, r in by_decay.items()})
    train_items: np.ndarray = split.refit_train.items if protocol.refit else split.train.items
    tested = PersonalFrequency.fit(train_items, data.n_items, decay)
    test = temporal_metrics(split, scorer_ranks(tested.score, data.n_items, exclude_seen=exclude_seen,
                                                batch_size=batch_size), ("test",), ks)
    apart = {**by_decay[decay]["temporal"], "test": test["temporal"]["test"]}
    return {"repeats": policy, "repeat_targets": shares, "decay": decay,
            "valid_by_decay": _by_decay({d: r["valid"] for d, r in by_decay.items()}),
            "valid": by_decay[decay]["valid"], "test": test["test"], "temporal": apart}


def _by_decay(valid: dict[float, dict[str, float]]) -> dict[str, float]:
    return {str(decay): metrics[SELECT_BY] for decay, metrics in valid.items()}
