"""`seqrec pipeline --resume`: what identifies a run, what it reads beyond its config, and which work folders go."""

from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path

import pytest
import torch
import yaml

import retriever.train
from offline.cli import main
from offline.jobs.pipeline_config import load_pipeline_config
from offline.jobs.pipeline_runs import WORK, drop_stale_runs, new_run, resume_run

RETRIEVER = {  # no train.threads: the runs below set it with --threads, or leave it to torch
    "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
    "train": {"epochs": 2, "batch_size": 64, "seed": 3},
}


def _config(tmp_path: Path, name: str = "tiny") -> Path:
    (tmp_path / "retriever.yaml").write_text(yaml.safe_dump(RETRIEVER))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "retriever": "retriever.yaml", "ranker": {"kind": "none"},
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}}}))
    return path


def _killed_after_the_first_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    save = retriever.train.save_checkpoint

    def save_then_die(*args, **kwargs):  # type: ignore[no-untyped-def]
        save(*args, **kwargs)
        raise RuntimeError("killed")

    monkeypatch.setattr(retriever.train, "save_checkpoint", save_then_die)


def test_a_training_killed_under_threads_resumes_without_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed during training under --threads 1, every --resume of the cron line (no --threads;
    docs/tutorials/nightly-retraining.md) failed:
    'last.pt: was written with a different config; resume with the same config or a new --out'."""
    config, artifacts = _config(tmp_path), tmp_path / "artifacts"
    _killed_after_the_first_checkpoint(monkeypatch)
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--threads", "1", "-q"]) == 1
    monkeypatch.undo()
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 0
    record = json.loads((artifacts / "current" / "pipeline.json").read_text())
    assert record["stages"]["train"]["resumed"] is True


def test_a_checkpoint_no_resume_can_continue_is_trained_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A run's checkpoint of another retriever config was refused by every --resume, which picked the same run
    again, with a hint (a new --out) that does not apply to a pipeline."""
    config, artifacts = _config(tmp_path), tmp_path / "artifacts"
    _killed_after_the_first_checkpoint(monkeypatch)
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]) == 1
    monkeypatch.undo()
    (last,) = artifacts.glob("work/*/bundle/run/last.pt")
    checkpoint = torch.load(last, weights_only=True)
    stored = json.loads(checkpoint["config"])
    stored["train"]["lr"] = 0.5
    checkpoint["config"] = json.dumps(stored)
    torch.save(checkpoint, last)
    with caplog.at_level(logging.WARNING):
        assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 0
    assert "was written with a different config" in caplog.text
    assert "training this run from scratch" in caplog.text
    record = json.loads((artifacts / "current" / "pipeline.json").read_text())
    assert record["stages"]["train"]["resumed"] is False


def test_keep_is_no_part_of_a_runs_identity(tmp_path: Path) -> None:
    """A run started with --keep 3 was not resumed without it ('no unfinished run ... starting a new one')."""
    path = _config(tmp_path)
    config, artifacts = load_pipeline_config(path), tmp_path / "artifacts"
    run = new_run(artifacts, config.model_copy(update={"keep": 5}), path)
    found = resume_run(artifacts, config)
    assert found is not None
    assert found.folder == run.folder
    assert found.state.config["keep"] == config.keep  # what this invocation prunes with, and pipeline.json records
    assert resume_run(artifacts, config.model_copy(update={"warm_start": True})) is None  # other starting weights


def test_an_artifacts_folder_inside_the_data_folder_does_not_count_as_data(tmp_path: Path) -> None:
    """run_inputs read the pipeline's own work folder (and lock) as source files, so --resume never resumed:
    'its data changed since it started; starting a new run'."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "events.csv").write_text("user_id,item_id,timestamp\n" + "".join(f"u1,{i},{t}\n"
                                                                               for t, i in enumerate("abc")))
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "data": {"dataset": "csv", "path": "src"}}))
    config, artifacts = load_pipeline_config(path), source / "art"
    (artifacts / "versions" / "v1").mkdir(parents=True)
    (artifacts / ".pipeline.lock").write_text("pid 1")
    run = new_run(artifacts, config, path)
    (run.folder / "data").mkdir()
    (run.folder / "data" / "manifest.json").write_text("{}")
    (artifacts / "versions" / "v2").mkdir()
    (artifacts / "versions" / "v2" / "manifest.json").write_text("{}")
    (artifacts / "current").symlink_to("versions/v2")
    (artifacts / ".pipeline.lock").write_text("pid 12345, since today")
    found = resume_run(artifacts, config)
    assert found is not None
    assert found.folder == run.folder
    (source / "events.csv").write_text((source / "events.csv").read_text() + "u2,a,9\nu2,b,10\n")
    assert resume_run(artifacts, config) is None  # the real data still counts


def _stale(artifacts: Path, name: str) -> Path:
    folder = artifacts / WORK / name
    (folder / "bundle" / "run").mkdir(parents=True)
    (folder / "state.json").write_text("{}")
    return folder


def test_runs_that_resume_would_never_continue_are_removed(tmp_path: Path) -> None:
    """A run that failed without --resume, or one left when its data or YAML changed, stayed in ARTIFACTS/work
    for good."""
    config, artifacts = _config(tmp_path), tmp_path / "artifacts"
    failed = _stale(artifacts, "20000101T000000Z-tiny")
    other = _stale(artifacts, "20000101T000000Z-other")  # another pipeline's run in the same folder
    busy = _stale(artifacts, "20000102T000000Z-tiny")
    with (busy / "bundle" / "run" / ".lock").open("w") as held:  # a process trains in it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]) == 0
    assert sorted(p.name for p in (artifacts / WORK).iterdir()) == [other.name, busy.name]
    assert not failed.exists()

    run = type("R", (), {"folder": _stale(artifacts, "20000103T000000Z-tiny")})()  # the run now going (resumed)
    newer = _stale(artifacts, "20000104T000000Z-tiny")
    assert drop_stale_runs(artifacts, run, "tiny") == [busy]  # its lock released
    assert sorted(p.name for p in (artifacts / WORK).iterdir()) == [other.name, run.folder.name, newer.name]
