"""A time budget for the whole pipeline (`budget_minutes`, `--budget-minutes`): a probe of the retriever's costs,
then a plan that fits the stages into the budget.

The probe times a few training steps spread over an epoch's batches and one validation pass over a sample of users,
and scales both to the full epoch and to every validated user (`probe_costs`). The plan (`plan_budget`) gives each
retriever the pipeline trains (the bundle's and, with holdout mining, the holdout one, which trains on the same
config) a share of the budget and leaves the rest to mining, the ranker, evaluation and the publish. What does not
fit shrinks, in this order, on keys the config leaves unset: the epochs (the loop's own wall-clock cap,
``train.budget_minutes``, stops each retriever in its share and keeps its best epoch), a sample of validation
users, then the model (half the window and width, one layer fewer). A budget under one epoch per the probe, or not
positive, is a `BudgetError` before training starts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from common.errors import SeqrecError
from retriever.sizing import shrunk

log = logging.getLogger(__name__)

MIN_EPOCHS = 3  # fewer epochs than this in a retriever's share: shrink the model before training
RETRIEVER_SHARE = {0: 0.0, 1: 0.55, 2: 0.3}  # of the budget, per retriever, by how many the pipeline trains
RANKER_FREE_SHARE = 0.9  # a pipeline with no ranker: the retriever gets nearly all of it


class BudgetError(SeqrecError):
    """A budget that cannot be planned: not positive, or too small for one epoch (the CLI exits 2)."""


def check_budget(minutes: float | None, source: str) -> float | None:
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not math.isfinite(minutes) \
            or minutes <= 0:
        raise BudgetError(f"{source} must be a positive number of minutes, got {minutes!r}")
    return float(minutes)


@dataclass(frozen=True)
class Probe:
    epoch_seconds: float  # one pass over the training windows
    eval_seconds: float  # one validation over every validated user

    @property
    def epoch_cost(self) -> float:
        return self.epoch_seconds + self.eval_seconds


class BudgetPlan(BaseModel):
    """What the planner decided, stored with the train stage in pipeline.json."""

    budget_minutes: float
    retrievers: int
    retriever_seconds: float  # each retriever's share
    epoch_seconds: float
    eval_seconds: float
    epochs_that_fit: int
    changed: dict[str, Any]  # key -> the planned value
    stages: dict[str, float]  # planned seconds per stage


def plan_budget(budget_minutes: float, values: dict[str, Any], fixed: set[str],
                probe: Callable[[dict[str, Any]], Probe], *, retrievers: int, n_users: int,
                ranker: bool = True) -> tuple[dict[str, Any], BudgetPlan]:
    """``values`` (dotted retriever settings) fitted into the budget; keys in ``fixed`` never change."""
    share = RETRIEVER_SHARE[retrievers] if ranker else RANKER_FREE_SHARE
    per_retriever = 60 * budget_minutes * share
    values = dict(values)
    costs = probe(values)
    for _ in range(4):
        if per_retriever / costs.epoch_cost >= MIN_EPOCHS:
            break
        sample = _eval_sample(costs, values, fixed, n_users)
        if sample is not None:
            users = values.get("train.eval_users") or n_users
            costs = Probe(costs.epoch_seconds, costs.eval_seconds * sample / users)
            values["train.eval_users"] = sample
            continue
        smaller = shrunk(values, fixed)
        if smaller is None:
            break
        log.info("budget: %.0f s per epoch does not fit %d epochs in %.0f s: a smaller model", costs.epoch_cost,
                 MIN_EPOCHS, per_retriever)
        values, costs = smaller, probe(smaller)
    fits = int(per_retriever // costs.epoch_cost)
    if fits < 1:
        needed = math.ceil(costs.epoch_cost / share / 60)
        raise BudgetError(f"budget_minutes {budget_minutes:g} is too small: one epoch of the retriever takes about "
                          f"{costs.epoch_cost:.0f} s (probe) and each of the {retrievers} retriever(s) gets "
                          f"{share:.0%} of the budget; give at least {needed} minutes")
    changed = _fit_schedule(values, fixed, fits, per_retriever)
    values.update(changed)
    stages = {"train": per_retriever, "mine": per_retriever if retrievers == 2 else 0.0,
              "rest": 60 * budget_minutes - per_retriever * retrievers}
    plan = BudgetPlan(budget_minutes=budget_minutes, retrievers=retrievers, retriever_seconds=round(per_retriever, 1),
                      epoch_seconds=round(costs.epoch_seconds, 2), eval_seconds=round(costs.eval_seconds, 2),
                      epochs_that_fit=fits, changed={k: values[k] for k in sorted(values) if k in changed or
                                                     k in ("model.max_len", "model.d_model", "model.n_layers",
                                                           "train.eval_users")},
                      stages={k: round(v, 1) for k, v in stages.items()})
    return values, plan


def _eval_sample(costs: Probe, values: dict[str, Any], fixed: set[str], n_users: int) -> int | None:
    """A smaller sample of validation users when validation costs more than half an epoch (at least 1,000)."""
    users = values.get("train.eval_users") or n_users
    if "train.eval_users" in fixed or costs.eval_seconds <= 0.5 * costs.epoch_seconds or users <= 1000:
        return None
    return max(1000, int(users * 0.5 * costs.epoch_seconds / costs.eval_seconds))


def _fit_schedule(values: dict[str, Any], fixed: set[str], fits: int, per_retriever: float) -> dict[str, Any]:
    changed: dict[str, Any] = {}
    if "train.budget_minutes" not in fixed:
        changed["train.budget_minutes"] = round(per_retriever / 60, 3)
    if "train.epochs" not in fixed and fits < int(values.get("train.epochs", 200)):
        changed["train.epochs"] = fits
        if "train.schedule" not in fixed and values.get("train.schedule") == "wsd":
            changed["train.schedule"] = "cosine"  # anneal over the epochs that fit
            if "train.patience" not in fixed:  # let the anneal run: a noisy early peak stopped it (budget 30)
                changed["train.patience"] = max(int(values.get("train.patience", 10)), fits // 3)
    return changed


def plan_lines(plan: BudgetPlan) -> list[str]:
    minutes = plan.budget_minutes
    lines = [f"budget {minutes:g} min: one epoch {plan.epoch_seconds:.1f} s + validation {plan.eval_seconds:.1f} s "
             f"(probe); {plan.retrievers} retriever(s) x {plan.retriever_seconds:.0f} s "
             f"(up to {plan.epochs_that_fit} epochs each), {plan.stages['rest']:.0f} s for mining, ranker, "
             "evaluation and publish"]
    lines += [f"  planned {key} = {value}" for key, value in plan.changed.items()]
    return lines


def probe_costs(config: Any, data: Any, steps: int = 4) -> Probe:
    """Seconds per training epoch and per validation of ``config`` (a `RunConfig`) on ``data``, from ``steps``
    optimiser steps spread over the epoch's batches and one validation of a sample of at most 256 users."""
    import torch

    from offline.data.features import with_item_features
    from offline.evaluation.retriever import dense_metrics, evaluation_sample
    from retriever.losses import LossContext, item_log_prob
    from retriever.train import make_optimizer, resolve_device, train_step
    from retriever.windows import batches, make_windows

    config, features = with_item_features(config, data)
    split, device = data.split(), resolve_device(config)
    torch.manual_seed(config.train.seed)
    model = config.build(data.n_items)
    if features is not None:
        model.encoder.set_item_features(features)
    model = model.to(device)
    max_len = config.max_len(data.n_items)
    windows = torch.from_numpy(make_windows(split.train.offsets, split.train.items, max_len,
                                            config.train.windows)).to(device)
    generator = torch.Generator(device=device).manual_seed(config.train.seed)
    ctx = LossContext(temperature=model.temperature, project=model._project, generator=generator,
                      item_log_prob=item_log_prob(torch.from_numpy(split.train.items), data.n_items).to(device))
    optimizer = make_optimizer(model, config)
    every = list(batches(windows, config.train.batch_size, generator))
    picks = np.linspace(0, len(every) - 1, steps + 1).round().astype(int)
    model.train()
    train_step(model, every[picks[0]], optimizer, config, ctx)  # warm-up: allocations, kernels
    start = time.perf_counter()
    for i in picks[1:]:
        train_step(model, every[i], optimizer, config, ctx)
    epoch = (time.perf_counter() - start) / steps * len(every)
    users = config.train.eval_users or data.n_users
    sample = evaluation_sample(split, min(users, 256), config.train.seed)
    start = time.perf_counter()
    dense_metrics(model, sample, data.n_items, max_len, ("valid",), config.train.eval_batch_size)
    evaluate = (time.perf_counter() - start) * users / max(1, len(sample.full))
    return Probe(epoch_seconds=epoch, eval_seconds=evaluate)
