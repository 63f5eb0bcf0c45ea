"""The retriever settings a pipeline run trains with, decided once after the prepare stage: the config's own
(`overrides:`, `--threads`, its retriever file), the sized defaults for the keys it leaves unset
(offline/jobs/sizing.py, only for the built-in defaults), and what the time budget changes (offline/jobs/budget.py).

The decision is written to ``WORK/<run>/plan.json`` and read back by ``--resume``, so a resumed training gets the
config its checkpoint was written with (a second probe would time differently).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from common.atomic import write_json
from offline.jobs.budget import BudgetPlan, plan_budget, plan_lines, probe_costs
from offline.jobs.pipeline_config import PipelineConfig
from offline.jobs.sizing import SizingRecord, data_shape, device_now, size_values, sizing_applies, sizing_lines
from retriever.config import read_yaml

log = logging.getLogger(__name__)

PLAN = "plan.json"


class RunPlan(BaseModel):
    """WORK/<run>/plan.json: the dotted retriever values the run trains with, and how they were decided."""

    values: dict[str, Any]
    sizing: SizingRecord
    budget: BudgetPlan | None = None


def given_values(config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    """The keys the user set: the config's overrides and --threads (the retriever file's keys are `file_keys`)."""
    return {**config.overrides, **({} if threads is None else {"train.threads": threads})}


def file_keys(path: Path | None) -> set[str]:
    """The dotted keys a retriever YAML sets (``model.d_model``, ...)."""
    if path is None:
        return set()
    raw = read_yaml(path, "config file")
    return {f"{section}.{key}" for section, body in raw.items() if isinstance(body, dict) for key in body}


def plan_run(folder: Path, data_path: Path, config: PipelineConfig, threads: int | None,
             budget_minutes: float | None) -> RunPlan:
    """The run's plan: read from ``folder`` when an earlier start of the run wrote it, else decided and written."""
    path = folder / PLAN
    if path.exists():
        return RunPlan.model_validate_json(path.read_text())
    from offline.data.prepared import load_prepared

    data = load_prepared(data_path)
    given = given_values(config, threads)
    if sizing_applies(config.retriever is not None, config.tune is not None):
        device = device_now(threads, str(given.get("train.device", "auto")))
        values, sizing = size_values(data_shape(data), device, given)
    else:
        values, sizing = dict(given), SizingRecord(applied=False, given=given)
    for line in sizing_lines(sizing):
        log.info("%s", line)
    budget = None
    if budget_minutes is not None:
        values, budget = _budgeted(config, data, values, given, budget_minutes)
    plan = RunPlan(values=values, sizing=sizing, budget=budget)
    write_json(path, plan.model_dump(mode="json"))
    return plan


def _budgeted(config: PipelineConfig, data: Any, values: dict[str, Any], given: dict[str, Any],
              budget_minutes: float) -> tuple[dict[str, Any], BudgetPlan]:
    from retriever.config import load_config_with

    fixed = set(given) | file_keys(config.retriever)
    ranker = config.ranker.kind != "none"
    retrievers = 2 if ranker and config.ranker.holdout else 1

    def probe(candidate: dict[str, Any]) -> Any:
        return probe_costs(load_config_with(config.retriever, candidate), data)

    values, plan = plan_budget(budget_minutes, values, fixed, probe, retrievers=retrievers, n_users=data.n_users,
                               ranker=ranker)
    for line in plan_lines(plan):
        log.info("%s", line)
    return values, plan


def stage_eta(plan: RunPlan | None, stage: str, elapsed: float) -> str:
    """The progress line's tail: the time so far and, under a budget, the planned time left."""
    if plan is None or plan.budget is None:
        return f"{elapsed:.0f} s so far"
    total, planned = 60 * plan.budget.budget_minutes, plan.budget.stages
    share = planned.get(stage, planned["rest"] if stage in ("train-ranker", "evaluate", "publish") else 0.0)
    return (f"{elapsed:.0f} s of {total:.0f} s so far, this stage planned {share:.0f} s, publish due in "
            f"{max(0.0, total - elapsed):.0f} s")
