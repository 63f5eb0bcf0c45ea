"""`seqrec backtest`: retrain at every step on what happened before it, publish, replay the next window.

    OUT/plan.json                   what was asked (a rerun with another plan is refused; the same plan resumes)
    OUT/data/step-NN/               the interactions before the step (+ item metadata), the step's pipeline config
    OUT/artifacts/<mode>/           each mode's artifacts folder (versions/, current): warm starts from its current
    OUT/steps/NN-<mode>.json        one finished step, written atomically: a killed backtest resumes after the last
    OUT/backtest.{json,md,png}      every step, the table, the plot

Each step runs the config's pipeline (`offline.jobs.pipeline.run_pipeline`) on the interactions before the step,
from scratch or warm-started from the mode's previous bundle, then replays the window through the served system
in process (`offline.backtest.replay`) and checks a sample over HTTP (`offline.backtest.http_check`).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import write_json
from common.errors import SeqrecError
from offline.backtest.http_check import check_over_http, sample_users
from offline.backtest.metrics import step_figures
from offline.backtest.replay import replay, user_windows
from offline.backtest.timeline import Timeline, check_plan, iso, load_timeline, write_step_config, write_training
from offline.jobs.pipeline_config import PipelineConfig, load_pipeline_config

log = logging.getLogger(__name__)

MODES = {"scratch": ("scratch",), "warm": ("warm",), "both": ("scratch", "warm")}


@dataclass(frozen=True)
class Plan:
    config: str
    start: float
    step: float
    steps: int
    mode: str = "both"
    budget_minutes: float | None = None
    k: int = 10
    http_sample: int = 20
    seed: int = 0
    train_seed: int | None = None  # train.seed of every training (None: the retriever config's)
    choose_warm: bool = False  # choose the warm-start overrides on the window before --start (choose.py)
    warm_overrides: dict[str, Any] | None = None  # given warm-start overrides (e.g. another run's choice)


def run_backtest(plan: Plan, out: Path, *, threads: int | None = None) -> list[dict[str, Any]]:
    """Every step of ``plan`` not yet finished under ``out``; returns every step's record."""
    if plan.mode not in MODES:
        raise SeqrecError(f"--mode must be one of {', '.join(MODES)}, got {plan.mode!r}")
    if plan.budget_minutes is not None and plan.budget_minutes <= 0:
        raise SeqrecError(f"--budget-minutes must be > 0, got {plan.budget_minutes}")
    config = load_pipeline_config(Path(plan.config))
    timeline = load_timeline(config)
    windows = check_plan(timeline, plan.start, plan.step, plan.steps)
    _check_training(timeline, config, windows[0][0])
    _claim(out, plan)
    config = _warm_schedule(config, timeline, plan, out, threads)
    records = []
    for i, (t0, t1) in enumerate(windows):
        data = out / "data" / f"step-{i:02d}"
        for mode in MODES[plan.mode]:
            done = out / "steps" / f"{i:02d}-{mode}.json"
            if done.is_file():
                records.append(json.loads(done.read_text()))
                continue
            log.info("step %d/%d (%s): train before %s, replay to %s", i + 1, len(windows), mode, iso(t0), iso(t1))
            record = _step(plan, config, timeline, i, (t0, t1), mode, data, out, threads, records)
            write_json(done, record)
            records.append(record)
    return records


def train_overrides(plan: Plan) -> dict[str, Any]:
    """The retriever overrides every training of the plan adds (its budget, its seed)."""
    extra: dict[str, Any] = {}
    if plan.budget_minutes is not None:
        extra["train.budget_minutes"] = plan.budget_minutes
    if plan.train_seed is not None:
        extra["train.seed"] = plan.train_seed
    return extra


def _warm_schedule(config: PipelineConfig, timeline: Timeline, plan: Plan, out: Path,
                   threads: int | None) -> PipelineConfig:
    """The config with the plan's warm-start overrides: given, chosen on the validation window, or its own."""
    if plan.warm_overrides is not None:
        return config.model_copy(update={"warm_start_overrides": plan.warm_overrides})
    if not plan.choose_warm or plan.mode == "scratch":
        return config
    from offline.backtest.choose import choose_warm

    log.info("choosing the warm-start schedule on the window before %s", iso(plan.start))
    choice = choose_warm(config, timeline, plan.start, plan.step, out / "choose", k=plan.k, threads=threads,
                         overrides=train_overrides(plan))
    write_json(out / "warm-choice.json", choice)
    return config.model_copy(update={"warm_start_overrides": choice["overrides"]})


def _check_training(timeline: Timeline, config: PipelineConfig, t0: float) -> None:
    """Refuse, before any training, a first step whose training set keeps no user (leave-one-out needs 3 events)."""
    need = max(3, config.data.min_user_interactions)
    _, counts = np.unique(timeline.users[: timeline.before(t0)], return_counts=True)
    if not (counts >= need).any():
        raise SeqrecError(f"--start {iso(t0)}: no user has {need} interactions before it, so the first step has "
                          "nothing to train on; start later")


def _claim(out: Path, plan: Plan) -> None:
    """Write OUT/plan.json, or check that the one there is this plan (a resume)."""
    record = out / "plan.json"
    if record.is_file():
        before = json.loads(record.read_text())
        if before != asdict(plan):
            changed = sorted(k for k in set(before) | set(asdict(plan)) if before.get(k) != asdict(plan).get(k))
            raise SeqrecError(f"{out} holds a backtest of another plan ({', '.join(changed)} differ); use another "
                              "--out or the same arguments to resume it")
        log.info("resuming the backtest in %s", out)
        return
    if out.exists() and any(out.iterdir()):
        raise SeqrecError(f"{out}: not empty and no backtest's folder (no plan.json); give a new --out")
    write_json(record, asdict(plan))


def _step(plan: Plan, config: PipelineConfig, timeline: Timeline, i: int, window: tuple[float, float], mode: str,
          data: Path, out: Path, threads: int | None, records: list[dict[str, Any]]) -> dict[str, Any]:
    from offline.jobs.pipeline import run_pipeline
    from offline.jobs.versions import switch_current
    from service.system.catalog import load_served

    started = time.perf_counter()
    t0, t1 = window
    if not (data / "interactions.parquet").is_file():
        write_training(timeline, t0, data)
    artifacts = out / "artifacts" / mode
    artifacts.mkdir(parents=True, exist_ok=True)
    previous = next((r for r in reversed(records) if r["mode"] == mode), None)
    reused = _reuse_first(records, mode, i, artifacts)
    if reused is not None:
        bundle_path, train_info = reused
    else:
        if previous is not None:  # a killed step may have published already: warm-start from the previous step's
            switch_current(artifacts, Path(previous["bundle"]))
        step_config = write_step_config(config, data, data, f"pipeline-{mode}", overrides=train_overrides(plan),
                                        keep=plan.steps + 1)
        summary = run_pipeline(step_config, artifacts, warm_start=mode == "warm",
                               threads=threads, keep=plan.steps + 1)
        bundle_path = Path(summary.path)
        train_info = {"train_seconds": summary.seconds.get("train"), "pipeline_seconds": sum(summary.seconds.values()),
                      "valid": summary.evaluation.get("valid"),
                      "trained": "warm" if mode == "warm" and previous else "scratch"}
    trained = time.perf_counter()
    bundle = load_served(bundle_path)
    users = user_windows(timeline, t0, t1)
    replayed = replay(bundle, users, t0, plan.k)
    figures = step_figures(replayed, set(timeline.items[: timeline.before(t0)].tolist()), len(bundle.index_of), plan.k)
    replayed_at = time.perf_counter()
    http = check_over_http(bundle_path, replayed, sample_users(replayed, plan.http_sample, plan.seed + i), t0, k=plan.k)
    finished = time.perf_counter()
    return {"step": i, "mode": mode, "start": iso(t0), "end": iso(t1), "t0": t0, "t1": t1,
            "train_rows": timeline.before(t0), "bundle": str(bundle_path.resolve()), "version": bundle.version,
            **train_info, **figures, "http": http,
            "seconds": {"train_and_publish": round(trained - started, 2), "replay": round(replayed_at - trained, 2),
                        "http_check": round(finished - replayed_at, 2), "step": round(finished - started, 2)}}


def _reuse_first(records: list[dict[str, Any]], mode: str, i: int,
                 artifacts: Path) -> tuple[Path, dict[str, Any]] | None:
    """Warm's first step has nothing to start from: beside scratch it serves scratch's first bundle (a copy)."""
    from offline.jobs.versions import VERSIONS, switch_current

    first = next((r for r in records if r["mode"] == "scratch" and r["step"] == 0), None)
    if mode != "warm" or i != 0 or first is None:
        return None
    source = Path(first["bundle"])
    target = artifacts / VERSIONS / source.name
    if not target.exists():
        shutil.copytree(source, target.with_name(f".{source.name}.tmp"), dirs_exist_ok=True)
        (target.with_name(f".{source.name}.tmp")).rename(target)
    switch_current(artifacts, target)
    info = {k: first.get(k) for k in ("train_seconds", "pipeline_seconds", "valid")}
    return target, {**info, "trained": "scratch (the scratch run's first bundle)"}
