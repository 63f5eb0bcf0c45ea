"""A `seqrec pipeline` run's work folder, ``ARTIFACTS/work/<stamp>-<name>/``: its record of finished stages
(state.json), which run ``--resume`` continues, and which left-behind runs go.

A run is identified by its pipeline config (less ``keep``, which only says how many versions stay) and by what it
reads beyond it (`run_inputs`); ``--resume`` continues the newest unpublished run so identified. Once a run is
chosen, the earlier work folders of the same pipeline name go (`drop_stale_runs`): none of them can be resumed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.atomic import write_json
from offline.jobs.pipeline_config import PipelineConfig
from offline.jobs.versions import CURRENT, LOCK, VERSIONS

log = logging.getLogger(__name__)

WORK, STATE = "work", "state.json"
NOT_IDENTITY = ("keep",)  # config fields a resumed run may change: they do not change what it makes


class StageRecord(BaseModel):
    """One finished stage in state.json and pipeline.json: its seconds, then what the stage reported
    (kept as extra fields, in the stage's order, so the JSON reads as it always has)."""

    model_config = ConfigDict(extra="allow")

    seconds: float

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RunState(BaseModel):
    """ARTIFACTS/work/<run>/state.json: the config a run was started with and its finished stages."""

    config_path: str
    config: dict[str, Any]  # `config_record`: what --resume matches on (`pipeline_identity`)
    started_at: str
    stages: dict[str, StageRecord] = {}
    inputs: dict[str, Any] | None = None  # `run_inputs`, matched by --resume too (None: a run from before it)


class Run:
    """One pipeline run's work folder and its record of finished stages."""

    def __init__(self, folder: Path, state: RunState) -> None:
        self.folder, self.state = folder, state

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def bundle(self) -> Path:
        return self.folder / "bundle"

    @property
    def mined(self) -> Path:
        return self.folder / "bundle.mining"

    def done(self, stage: str) -> bool:
        return stage in self.state.stages

    def finish(self, name: str, seconds: float, **info: Any) -> None:
        self.state.stages[name] = StageRecord(seconds=round(seconds, 1), **info)
        self.save()

    def save(self) -> None:
        write_json(self.folder / STATE, self.state.model_dump())  # default=str: a stage may report any value


def config_record(config: PipelineConfig) -> dict[str, Any]:
    """The config as state.json and pipeline.json record it; without ``split`` under leave-one-out's default (as
    every run from before the section has it)."""
    return config.model_dump(mode="json", exclude={"split"} if config.split is None else None)


def new_run(artifacts: Path, config: PipelineConfig, config_path: Path) -> Run:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = artifacts / WORK / f"{stamp}-{config.name}"
    folder.mkdir(parents=True, exist_ok=False)
    run = Run(folder, RunState(config_path=str(config_path), config=config_record(config),
                               started_at=stamp, inputs=run_inputs(config, artifacts)))
    run.save()
    return run


def pipeline_identity(config: dict[str, Any]) -> dict[str, Any]:
    """A pipeline config's dump as --resume matches it: without `NOT_IDENTITY` (a run killed under --keep 3 was not
    resumed without it). warm_start stays: it changes the weights the training starts from."""
    return {key: value for key, value in config.items()
            if key not in NOT_IDENTITY and not (key == "budget_minutes" and value is None)}  # runs from before it


def run_inputs(config: PipelineConfig, artifacts: Path) -> dict[str, Any]:
    """What a run reads beyond its config: the retriever YAML (its sha256) and the data's source files (each
    one's name, size and modification time), less the pipeline's own files when ``artifacts`` lies inside the data
    folder (its work folder changed with every stage, so such a run never resumed). Either changed since a run
    started, --resume starts a new run: the old one would publish a model of the old data, or fail to resume a
    training of the old config."""
    inputs: dict[str, Any] = {}
    if config.retriever is not None and config.retriever.is_file():
        inputs["retriever"] = hashlib.sha256(config.retriever.read_bytes()).hexdigest()
    sources = [config.data.path, config.data.reader.get("items_path")]
    own = artifacts.resolve()
    for path in (Path(p) for p in sources if p is not None):
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        inputs.setdefault("data", []).extend([str(f), f.stat().st_size, f.stat().st_mtime_ns]
                                             for f in files if f.exists() and not _pipeline_file(f, own))
    return inputs


def _pipeline_file(file: Path, artifacts: Path) -> bool:
    """Whether ``file`` is one the pipeline writes under ``artifacts`` (work/, versions/, current, the locks)."""
    try:
        top = file.resolve().relative_to(artifacts).parts[0]
    except ValueError:
        return False
    return top in (WORK, VERSIONS, CURRENT, LOCK) or top.startswith(f".{CURRENT}.")


def resume_run(artifacts: Path, config: PipelineConfig) -> Run | None:
    """The newest unpublished run of this config (`pipeline_identity`) and these inputs (`run_inputs`), if any."""
    runs = sorted((artifacts / WORK).glob("*/" + STATE)) if (artifacts / WORK).is_dir() else []
    inputs = json.loads(json.dumps(run_inputs(config, artifacts)))  # as state.json reads back: lists, not tuples
    current = config_record(config)
    for state_file in reversed(runs):
        state = RunState.model_validate_json(state_file.read_text())
        if pipeline_identity(state.config) != pipeline_identity(current) or "publish" in state.stages:
            continue
        if state.inputs is not None and state.inputs != inputs:
            changed = [name for name in ("retriever", "data") if state.inputs.get(name) != inputs.get(name)]
            log.warning("%s: its %s changed since it started; starting a new run", state_file.parent,
                        " and ".join(changed))
            return None
        state.config = current  # this invocation's keep: what it prunes with, and what pipeline.json records
        return Run(state_file.parent, state)
    return None


def drop_stale_runs(artifacts: Path, run: Run, name: str) -> list[Path]:
    """Delete the work folders of pipeline ``name`` that started before ``run``, the one now going: --resume only
    ever continues the newest run of a config, so none of them would be resumed again (a run that failed without
    --resume, one left behind when its YAML or data changed). Runs of other pipeline names sharing ARTIFACTS stay,
    and so does a folder that a process still holds a lock in."""
    removed = []
    for folder in sorted((artifacts / WORK).iterdir()):
        if not folder.is_dir() or folder.name.partition("-")[2] != name or folder.name >= run.folder.name:
            continue
        if _held(folder):
            log.warning("%s: a process holds a lock in it; left in place", folder)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    if removed:
        log.info("removed %d earlier run(s) of %s that --resume would not continue: %s", len(removed), name,
                 ", ".join(f.name for f in removed))
    return removed


def _held(folder: Path) -> bool:
    """Whether another process holds one of the lock files under ``folder`` (a training's, a search trial's)."""
    for lock in (p for p in folder.rglob("*lock") if p.is_file()):
        with lock.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    return False
