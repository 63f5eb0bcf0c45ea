"""`seqrec train --protocol temporal`: the split a training runs on, its figures, and the final fit (--refit).

Under the temporal protocol (offline/data/temporal.py) the model learns from what happened before the validation
cut and early stopping reads the validation window. With refit, a second fit on everything before the test cut
runs for the epochs the validation chose (no validation during it: nothing is chosen there) and is the model the
test window scores and the artifact holds; the validation figures stay those of the selected first fit.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from offline.data.prepared import PreparedDataset
from offline.data.sequences import Sequences
from offline.data.split import LeaveOneOut
from offline.data.temporal import TemporalProtocol, TemporalSplit, repeat_shares
from offline.evaluation.temporal import retriever_ranks, temporal_metrics
from retriever.checkpoint import SELECTION_METRIC
from retriever.config import RunConfig
from retriever.model import Retriever
from retriever.train import FitResult, fit

log = logging.getLogger(__name__)


def protocol_split(data: PreparedDataset, temporal: TemporalProtocol | None) -> LeaveOneOut | TemporalSplit:
    return data.split() if temporal is None else temporal.split_data(data)


def protocol_repeat_shares(data: PreparedDataset, split: LeaveOneOut | TemporalSplit) -> dict[str, float]:
    return repeat_shares(split) if isinstance(split, TemporalSplit) else data.repeat_shares


def refit(config: RunConfig, split: TemporalSplit, first: FitResult, n_items: int, run_dir: Path,
          **fit_options: Any) -> FitResult:
    """A fit on everything before the test cut for the first fit's best epoch count; its last weights."""
    epochs = max(1, first.best_epoch)
    train = config.train.model_copy(update={"epochs": epochs, "eval_every": epochs, "patience": 1,
                                            "budget_minutes": None})
    refit_config = config.model_copy(update={"train": train})
    log.info("refit on %d interactions before the test cut for %d epochs", int(split.refit_train.lengths.sum()),
             epochs)

    def unmeasured(model: Retriever) -> dict[str, float]:
        return {SELECTION_METRIC: math.nan}  # NaN never counts as a gain: the last weights are returned

    return fit(refit_config, split.refit_train.offsets, split.refit_train.items, n_items, unmeasured, run_dir,
               **fit_options)


def temporal_final(temporal: TemporalProtocol, config: RunConfig, split: TemporalSplit, evaluated: TemporalSplit,
                   first: FitResult, n_items: int, refit_dir: Path, *, max_len: int, exclude_seen: bool,
                   batch_size: int | None, **fit_options: Any
                   ) -> tuple[dict[str, Any], dict[str, Any], Retriever, FitResult | None]:
    """(metrics, protocol record, the model the artifact holds, the refit's result or None) after the first fit."""
    refitted = refit(config, split, first, n_items, refit_dir, **fit_options) if temporal.refit else None
    tested = first.model if refitted is None else refitted.model
    metrics = temporal_figures(evaluated, first.model, tested, max_len, exclude_seen=exclude_seen,
                               batch_size=batch_size)
    return metrics, {**temporal.record(), **metrics.pop("temporal")}, tested, refitted


def trained_on(split: LeaveOneOut | TemporalSplit, refitted: FitResult | None) -> Sequences:
    """The training positions of the model an artifact holds (the item counts it stores)."""
    return split.refit_train if refitted is not None and isinstance(split, TemporalSplit) else split.train


def temporal_figures(split: TemporalSplit, selected: Retriever, tested: Retriever, max_len: int, *,
                     exclude_seen: bool, batch_size: int | None) -> dict[str, Any]:
    """{"valid", "test", "temporal"} of `temporal_metrics`: validation by the selected model, test by ``tested``
    (the same model, or the refit)."""
    ranks = {"valid": retriever_ranks(selected, max_len, exclude_seen=exclude_seen, batch_size=batch_size),
             "test": retriever_ranks(tested, max_len, exclude_seen=exclude_seen, batch_size=batch_size)}
    return temporal_metrics(split, ranks)  # type: ignore[arg-type]
