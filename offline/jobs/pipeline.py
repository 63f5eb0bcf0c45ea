"""`seqrec pipeline`: prepare -> train -> export -> mine -> train ranker -> evaluate -> publish.

    ARTIFACTS/work/<run>/      state.json (finished stages), data/, bundle/, bundle.mining/
    ARTIFACTS/versions/<id>/   published bundles (retriever + ranker + catalogue + pipeline.json)
    ARTIFACTS/current          symlink to the served version, switched atomically

Every stage writes into the run's work folder; only `publish` touches ``versions/`` and ``current``: it moves
the finished bundle into ``versions/`` (one rename) and then renames a new symlink over ``current``, so a failing
or killed stage never changes what is served. ``--resume`` continues the newest unpublished run of the same config
and inputs after its last finished stage (training itself resumes from its last checkpoint), or starts a new run
when there is none, so a scheduled job can always pass it (offline/jobs/pipeline_runs.py); the earlier work
folders of the same pipeline name then go. The newest ``keep`` versions stay (never ``current``'s).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from tqdm import tqdm

from common.atomic import sync, sync_tree, write_json
from common.errors import SeqrecError
from common.folders import refuse_seqrec_folder
from offline.jobs.budget import check_budget
from offline.jobs.pipeline_config import PipelineConfig, load_pipeline_config, temporal_protocol, with_split
from offline.jobs.pipeline_plan import PLAN, RunPlan, plan_run, stage_eta
from offline.jobs.pipeline_runs import Run, StageRecord, drop_stale_runs, new_run, resume_run
from offline.jobs.versions import CURRENT, VERSIONS, pipeline_lock, prune_versions, switch_current
from offline.tables import markdown_table
from offline.tune.section import keep_report

log = logging.getLogger(__name__)

STAGES = ("prepare", "train", "export", "mine", "train-ranker", "evaluate", "publish")


class PublishRecord(BaseModel):
    """BUNDLE/pipeline.json: how a published bundle was made."""

    config: dict[str, Any]
    stages: dict[str, StageRecord]
    published_at: str


class PipelineSummary(BaseModel):
    """What `run_pipeline` returns and `summary_table` prints."""

    version: str
    path: str
    seconds: dict[str, float]
    evaluation: dict[str, Any]


def check_artifacts_folder(artifacts: Path) -> None:
    """Refuse, before any stage, an --out the run could not publish into: a prepared dataset or a bundle (it
    wrote current/, versions/ and work/ beside their files), or a `current` that is not the link it replaces
    (a folder copied there failed the publish, after every stage had run)."""
    refuse_seqrec_folder(artifacts, "--out (the artifacts folder: current, versions/, work/)")
    current = artifacts / CURRENT
    if current.exists() and not current.is_symlink():
        raise SeqrecError(f"{current} is a {'folder' if current.is_dir() else 'file'}, not the symlink seqrec "
                          f"publishes through; move it away (a bundle served from here belongs in "
                          f"{artifacts / VERSIONS}/)")


def run_pipeline(config_path: Path, artifacts: Path, *, resume: bool = False, keep: int | None = None,
                 threads: int | None = None, warm_start: bool = False,
                 budget_minutes: float | None = None, split: dict[str, str] | None = None) -> PipelineSummary:
    """Run every stage not yet finished; returns the summary (stage times, metrics, published version).
    ``budget_minutes`` (or the config's): plan the stages to publish within it (offline/jobs/budget.py).
    ``split``: the command line's protocol and cuts over the config's ``split:`` section (`with_split`)."""
    config = with_split(load_pipeline_config(config_path), split or {})
    if keep is not None:
        config = config.model_copy(update={"keep": keep})
    if warm_start:
        config = config.model_copy(update={"warm_start": True})
    if budget_minutes is not None:
        config = config.model_copy(update={"budget_minutes": check_budget(budget_minutes, "--budget-minutes")})
    check_budget(config.budget_minutes, f"{config_path}: budget_minutes")
    check_artifacts_folder(artifacts)
    artifacts.mkdir(parents=True, exist_ok=True)
    with pipeline_lock(artifacts):  # one run per artifacts folder at a time
        run = resume_run(artifacts, config) if resume else None
        if run is not None:
            log.info("resuming %s after %s", run.folder, ", ".join(run.state.stages) or "nothing")
        else:
            if resume:
                log.info("no unfinished run of %s under %s: starting a new one", config.name, artifacts)
            run = new_run(artifacts, config, config_path)
        drop_stale_runs(artifacts, run, config.name)
        started = time.perf_counter()
        stages: dict[str, Callable[[Run, PipelineConfig, int | None], dict[str, Any]]] = {
            "prepare": _prepare, "train": _train_planned, "export": _export, "mine": _mine,
            "train-ranker": _train_ranker, "evaluate": _evaluate, "publish": lambda r, c, _: _publish(r, c, artifacts)}
        bar = tqdm(STAGES, desc="pipeline", unit="stage", disable=None)
        for name in bar:
            bar.set_postfix_str(name)
            if run.done(name):
                continue
            if name in ("mine", "train-ranker") and config.ranker.kind == "none":
                run.finish(name, 0.0, skipped=True)
                continue
            log.info("stage %d/%d: %s; %s", STAGES.index(name) + 1, len(STAGES), name,
                     stage_eta(_stored_plan(run), name, time.perf_counter() - started))
            start = time.perf_counter()
            info = stages[name](run, config, threads)
            run.finish(name, time.perf_counter() - start, **info)
        bar.close()
        summary = _summary(run)
        prune_versions(artifacts, config.keep)
        shutil.rmtree(run.folder, ignore_errors=True)  # everything needed is in the published bundle
        return summary


def _prepare(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    from offline.data.prepare import Filters, prepare_dataset
    from offline.data.readers import ReaderOptions
    from offline.jobs.catalog import take_added_items
    from offline.jobs.tables import require_clock

    d = config.data
    options = ReaderOptions(path=d.path, synthetic=d.synthetic or None, **d.reader)
    manifest = prepare_dataset(d.dataset, run.data, options, Filters(d.min_user_interactions, d.k_core, d.min_rating),
                               download=d.download, overwrite=True)
    require_clock(run.data, manifest, config.ranker.features)  # now, not after the retriever has trained
    protocol = temporal_protocol(config)
    split = {} if protocol is None else {"split": _temporal_split(run, config).record()}  # refused here, not later
    added = take_added_items(run.folder.parent.parent, run.data)  # ARTIFACTS/work/<run>
    return {"users": manifest["users"], "items": manifest["items"], "interactions": manifest["interactions"],
            "repeat_targets": manifest["repeat_targets"], **split, **added}


def _temporal_split(run: Run, config: PipelineConfig) -> Any:
    """The run's temporal split (None under leave-one-out): what the mining, ranker and evaluation stages use."""
    from offline.data.prepared import load_prepared

    protocol = temporal_protocol(config)
    return None if protocol is None else protocol.split_data(load_prepared(run.data))


def _stored_plan(run: Run) -> RunPlan | None:
    path = run.folder / PLAN
    return RunPlan.model_validate_json(path.read_text()) if path.exists() else None


def _train_planned(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    """The train stage with the run's plan (the sized defaults, the budget's changes): decided once, then kept."""
    plan = plan_run(run.folder, run.data, config, threads, config.budget_minutes)
    info = _train(run, config, plan.values)
    return {**info, "sizing": plan.sizing.model_dump(mode="json"),
            **({} if plan.budget is None else {"budget": plan.budget.model_dump(mode="json")})}


def _train(run: Run, config: PipelineConfig, values: dict[str, Any]) -> dict[str, Any]:
    from offline.data.prepared import load_prepared
    from offline.jobs.catalog import served_bundle
    from offline.jobs.train import train_retriever
    from retriever.artifact import read_manifest
    from retriever.checkpoint import CheckpointMismatch
    from retriever.config import load_config_with

    init_from = served_bundle(run.folder.parent.parent) if config.warm_start else None
    if config.warm_start and init_from is None:  # the first run of a warm-starting cron job
        log.warning("warm start: %s serves no bundle yet; training from scratch", run.folder.parent.parent / CURRENT)
    extra = config.warm_start_overrides if init_from else {}
    retriever_config = load_config_with(config.retriever, {**values, **extra})
    if config.tune is not None:  # the search starts from the config and overrides above (offline/tune)
        from offline.tune.study import tuned_config

        base = retriever_config.model_dump(mode="json")
        retriever_config = tuned_config(config.tune, base, load_prepared(run.data), run.folder / "tune",
                                        temporal=temporal_protocol(config))
    resume = (run.bundle / "run" / "last.pt").exists()
    if (run.bundle / "manifest.json").exists():  # killed after the artifact was written: nothing left to do
        manifest = read_manifest(run.bundle)
    else:
        try:
            manifest = train_retriever(retriever_config, load_prepared(run.data), run.bundle, resume=resume,
                                       init_from=init_from, temporal=temporal_protocol(config))
        except CheckpointMismatch as err:  # refused for good: every --resume would pick this run and fail again
            log.warning("%s; training this run from scratch", err)
            shutil.rmtree(run.bundle / "run")
            resume = False
            manifest = train_retriever(retriever_config, load_prepared(run.data), run.bundle, init_from=init_from,
                                       temporal=temporal_protocol(config))
    return {"version": manifest.version, "resumed": resume, "repeats": manifest.repeats,
            "warm_start_from": None if init_from is None else str(init_from),
            "valid_ndcg@10": manifest.metrics["valid"]["NDCG@10"],
            "test_ndcg@10": manifest.metrics["test"]["NDCG@10"]}


def _export(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    from retriever.artifact import read_manifest, rewrite_index
    from retriever.index import IndexSpec, spec_for_catalogue

    manifest = read_manifest(run.bundle)
    spec = spec_for_catalogue(manifest.n_items) if config.index == "auto" else IndexSpec(kind=config.index)
    if manifest.index.get("kind") != spec.kind:
        manifest = rewrite_index(run.bundle, spec)
    return {"index": manifest.index["kind"], "items": manifest.n_items}


def _mine(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    from offline.data.prepared import load_prepared
    from offline.jobs.rank import mine_to
    from retriever.artifact import load_artifact

    shutil.rmtree(run.mined, ignore_errors=True)  # a killed mine leaves a partial folder
    artifact = load_artifact(run.bundle)
    _, info, _ = mine_to(run.mined, artifact, load_prepared(run.data), config.ranker, _temporal_split(run, config))
    return {"recall": info.get(f"recall@{config.ranker.depth}")}


def _train_ranker(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    from offline.data.prepared import load_prepared
    from offline.jobs.rank import train_ranker

    manifest = train_ranker(run.bundle, load_prepared(run.data), config.ranker, mined_dir=run.mined,
                            split=_temporal_split(run, config))
    return {"kind": manifest.kind, "selection": manifest.selection}


def _evaluate(run: Run, config: PipelineConfig, threads: int | None) -> dict[str, Any]:
    from offline.data.prepared import load_prepared
    from offline.jobs.evaluate import evaluate_bundle

    protocol = temporal_protocol(config)
    if protocol is None:
        result = evaluate_bundle(run.bundle, load_prepared(run.data))
    else:  # the same served system on the windows (offline/jobs/evaluate_temporal.py)
        from offline.jobs.evaluate_temporal import evaluate_bundle_temporal

        result = evaluate_bundle_temporal(run.bundle, load_prepared(run.data), protocol)
    keep = {"system": result["stage"], "depth": result["depth"], "repeats": result["repeats"],
            "repeat_targets": result["repeat_targets"]}
    for split in ("valid", "test"):
        keep[split] = result[split]
        if "retriever" in result:
            keep[f"retriever_{split}"] = result["retriever"][split]
    if protocol is not None:
        keep.update(protocol=result["protocol"], temporal=result["temporal"])
    return keep


def _publish(run: Run, config: PipelineConfig, artifacts: Path) -> dict[str, Any]:
    """Move the bundle into versions/ (one rename), then rename a new symlink over `current`."""
    from offline.jobs.catalog import carry_changes

    version = str(run.state.stages["train"].info["version"])
    versions = artifacts / VERSIONS
    versions.mkdir(parents=True, exist_ok=True)
    target = versions / version
    if not target.exists():  # else a killed publish already moved it: only the switch is left
        shutil.rmtree(run.bundle / "run", ignore_errors=True)  # checkpoints; the curve is in history.jsonl
        record = PublishRecord(config=run.state.config, stages=run.state.stages,
                               published_at=datetime.now(UTC).isoformat(timespec="seconds"))
        write_json(run.bundle / "pipeline.json", record.model_dump())
        carry_changes(artifacts, run.bundle)
        keep_report(run.folder / "tune", run.bundle)  # the search's report, when the config has `tune:`
        sync_tree(run.bundle)  # every file on disk before the rename publishes it
        os.replace(run.bundle, target)
        sync(versions)
    _fault_point("publish-before-switch")
    switch_current(artifacts, target)
    return {"version": version, "path": str(target)}


def _fault_point(name: str) -> None:
    """Fault injection for the reliability tests: SEQREC_FAULT_INJECT=<name> kills this process
    here with SIGKILL (as `kill -9` would), between two steps that must survive it."""
    if os.environ.get("SEQREC_FAULT_INJECT") == name:
        log.warning("fault injection: SIGKILL at %s", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _summary(run: Run) -> PipelineSummary:
    stages = run.state.stages
    published, evaluate = stages["publish"].info, stages.get("evaluate")
    return PipelineSummary(version=published["version"], path=published["path"],
                           seconds={name: stages[name].seconds for name in STAGES if name in stages},
                           evaluation=evaluate.model_dump() if evaluate is not None else {})


def summary_table(summary: PipelineSummary) -> str:
    """Stage times, then validation/test metrics of the retriever and the two-stage system."""
    times = [*((name, f"{seconds:.1f}") for name, seconds in summary.seconds.items()),
             ("total", f"{sum(summary.seconds.values()):.1f}")]
    ev = summary.evaluation
    rows = [("retriever", s, ev.get(f"retriever_{s}")) for s in ("valid", "test")]
    rows += [("two-stage" if ev.get("system") == "two-stage" else "retriever", s, ev.get(s)) for s in ("valid", "test")]
    metrics_rows, seen = [], set()
    for system, split, metrics in rows:
        if metrics is None or (system, split) in seen:
            continue
        seen.add((system, split))
        metrics_rows.append((system, split, *(f"{metrics[k]:.4f}" for k in ("HR@10", "NDCG@10", "MRR@10"))))
    return "\n".join([markdown_table(("stage", "seconds"), times), "",
                      markdown_table(("system", "split", "HR@10", "NDCG@10", "MRR@10"), metrics_rows), "",
                      *_repeat_line(ev), f"published {summary.version} -> {summary.path}"])


def _repeat_line(evaluation: dict[str, Any]) -> list[str]:
    """Which repeat policy the figures above follow, and how repeat-heavy the data is."""
    shares = evaluation.get("repeat_targets")
    if not shares:
        return []
    return [f"repeats: {evaluation.get('repeats')} ({shares['valid']:.1%} of validation, {shares['test']:.1%} of "
            "test targets are already in the user's history)", ""]
