"""`seqrec pipeline`: every stage, atomic publishing, resume after a failure, pruning, clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from offline.cli import main
from offline.cli.common import shipped_configs
from offline.jobs import rank as ranking
from offline.jobs.pipeline import STAGES, PublishRecord, load_pipeline_config
from offline.jobs.pipeline_runs import RunState

TINY_RETRIEVER = {
    "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
    "train": {"epochs": 3, "batch_size": 64, "seed": 3, "threads": 1},
}


def _config(tmp_path: Path, *, keep: int = 3, kind: str = "lgbm", seed: int = 3, name: str = "pipeline") -> Path:
    retriever = tmp_path / "tiny.yaml"
    retriever.write_text(yaml.safe_dump(TINY_RETRIEVER))
    config = {
        "name": "tiny",
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}},
        "retriever": "tiny.yaml",  # relative to the pipeline config
        "overrides": {"train.seed": seed},
        "ranker": {"kind": kind, "mining": "direct", "depth": 20},
        "keep": keep,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _versions(artifacts: Path) -> list[str]:
    return sorted(p.name for p in (artifacts / "versions").iterdir())


def _watch_disk(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every fsync (the path of its descriptor) and every os.replace, in order."""
    events: list[tuple[str, ...]] = []
    fsync, replace = os.fsync, os.replace

    def synced(fd: int) -> None:
        events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def named(path: str | os.PathLike[str]) -> str:  # the real folder, the name itself (not a link's target)
        return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))

    def replaced(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("replace", named(src), named(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "replace", replaced)
    return events


def test_pipeline_runs_every_stage_and_publishes_atomically(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from service.system.loader import load_bundle

    artifacts = tmp_path / "artifacts"
    disk = _watch_disk(monkeypatch)
    assert main(["pipeline", "--config", str(_config(tmp_path)), "--out", str(artifacts), "-q"]) == 0
    out = capsys.readouterr().out
    for stage in STAGES:
        assert f"| {stage} |" in out
    assert "| two-stage | test |" in out
    assert "| retriever | valid |" in out
    current = artifacts / "current"
    assert current.is_symlink()
    assert not os.path.isabs(os.readlink(current))  # relative: the folder can move (or be a volume)
    (version,) = _versions(artifacts)
    assert current.resolve() == (artifacts / "versions" / version).resolve()
    bundle = load_bundle(current)  # checksums, ranker lineage and a smoke query
    assert bundle.version == version
    assert bundle.ranker is not None
    assert bundle.ranker.kind == "lgbm"
    record = json.loads((current / "pipeline.json").read_text())
    assert list(record) == ["config", "stages", "published_at"]  # the keys written before records were typed
    assert list(record["config"]["ranker"]) == ["kind", "mining", "depth", "per_user", "holdout_per_user", "sources",
                                                "cooc_share", "features", "members"]
    assert all(next(iter(stage)) == "seconds" for stage in record["stages"].values())
    assert list(record["stages"]) == list(STAGES[:-1])
    assert record["stages"]["evaluate"]["system"] == "two-stage"
    # The synthetic data is repeat-heavy: `auto` (the default) resolves to allow, and the records say so.
    shares = record["stages"]["prepare"]["repeat_targets"]
    assert shares["valid"] > 0.5
    assert record["stages"]["evaluate"]["repeat_targets"] == shares
    assert record["stages"]["train"]["repeats"] == record["stages"]["evaluate"]["repeats"] == "allow"
    assert bundle.exclude_seen is False  # so the service serves history items by default
    assert f"repeats: allow ({shares['valid']:.1%} of validation" in out
    assert not (current / "run").exists()  # training checkpoints are not shipped
    assert not list((artifacts / "work").iterdir())  # the run's work folder is gone after publishing
    # On disk before it is published: every file of the bundle is flushed before the rename into versions/, and
    # that rename and the switch of `current` each before the run ends (a power cut loses neither half-way).
    published = str((artifacts / "versions" / version).resolve())
    (at, staged), = [(n, e[1]) for n, e in enumerate(disk) if e[0] == "replace" and e[2] == published]
    files = {str(p.relative_to(current.resolve())) for p in current.resolve().rglob("*")}
    flushed = {os.path.relpath(e[1], staged) for e in disk[:at] if e[0] == "sync" and e[1].startswith(staged + "/")}
    assert files <= flushed
    switch = max(n for n, e in enumerate(disk) if e[0] == "replace" and e[2] == str(artifacts.resolve() / "current"))
    assert ("sync", str((artifacts / "versions").resolve())) in disk[at:switch]
    assert ("sync", str(artifacts.resolve())) in disk[switch:]


def test_a_failing_stage_never_touches_current_and_resume_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    artifacts = tmp_path / "artifacts"
    assert main(["pipeline", "--config", str(_config(tmp_path, name="first")), "--out", str(artifacts), "-q"]) == 0
    first = (artifacts / "current").resolve()
    config = _config(tmp_path, seed=4)  # other weights, so another version

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("ranker exploded")

    monkeypatch.setattr(ranking, "train_ranker", broken)
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]) == 1
    assert "ranker exploded" in capsys.readouterr().err
    assert (artifacts / "current").resolve() == first  # still the complete first bundle
    (run,) = list((artifacts / "work").iterdir())
    state = json.loads((run / "state.json").read_text())
    assert list(state["stages"]) == ["prepare", "train", "export", "mine"]

    monkeypatch.undo()
    trained = json.loads((run / "bundle" / "manifest.json").read_text())["version"]
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 0
    assert (artifacts / "current").resolve().name == trained  # resumed, not retrained
    assert len(_versions(artifacts)) == 2
    assert not list((artifacts / "work").iterdir())
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 0  # a new run
    assert (artifacts / "current").resolve().name != first.name


def test_old_versions_are_pruned_but_never_current(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    for seed in (3, 4):
        config = _config(tmp_path, keep=1, kind="none", seed=seed)
        assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]) == 0
    (kept,) = _versions(artifacts)
    assert (artifacts / "current").resolve().name == kept
    assert not (artifacts / "current" / "ranker").exists()  # kind none: a retriever-only bundle


def test_a_second_run_on_the_same_folder_is_refused_until_the_first_ends(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """Two runs on one ARTIFACTS (a cron job overlapping a slow one) would resume the same work folder; the second
    is refused while another process holds the folder, and a holder killed with SIGKILL leaves no stale lock."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from offline.jobs.versions import pipeline_lock\n"
         "with pipeline_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(300)", str(artifacts)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        config = _config(tmp_path, kind="none")
        assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"seqrec: error: {artifacts}: another seqrec pipeline holds it (pid {holder.pid}, "
                                 "since 20")
        assert err[0].endswith("); wait for that run to end, or choose another --out")
        assert not (artifacts / "work").exists()
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "--resume", "-q"]) == 0
    assert len(_versions(artifacts)) == 1


def test_pipeline_config_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["pipeline", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "missing.yaml: no such pipeline config (seqrec ships " in err[0]
    assert "demo.yaml" in err[0]  # the shipped configs are listed, with where they are
    assert str(shipped_configs() / "pipeline") in err[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "data": {"dataset": "synthetic"}, "retriever": "r.yaml",
                                   "ranker": {"kind": "forest"}}))
    assert main(["pipeline", "--config", str(bad), "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert "ranker.kind" in err
    assert "Traceback" not in err
    # An unknown extra feature is refused when the config loads, before any stage has run.
    bad.write_text(yaml.safe_dump({"name": "x", "data": {"dataset": "synthetic"}, "retriever": "r.yaml",
                                   "ranker": {"features": ["cooc_last1", "cooc_last2"]}}))
    assert main(["pipeline", "--config", str(bad), "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "ranker.features: Value error, unknown ranker features ['cooc_last2']" in err
    assert "Traceback" not in err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(("change", "message"), [
    # an unknown reader was an internal error (ValueError) at the prepare stage
    ({"data": {"dataset": "nope"}}, "data.dataset: Value error, unknown dataset 'nope'; choose from ml-100k"),
    # the name names the run's work folder: "../x" put it outside ARTIFACTS/work
    ({"name": "../../x"}, "name: Value error, '../../x' names folders: use letters, digits"),
    ({"name": "a/b"}, "name: Value error, 'a/b' names folders"),
    # each of these was an internal error (TypeError) at the prepare stage
    ({"data": {"dataset": "csv", "reader": {"bogus": 1}}},
     "data.reader: Value error, unknown option 'bogus'; a reader takes user_col, item_col, time_col, sep, items_path"),
    ({"data": {"dataset": "csv", "reader": {"sep": 5}}}, "data.reader: Value error, sep must be a string, got 5"),
    ({"data": {"dataset": "csv", "reader": {"sep": ";;"}}},
     "data.reader: Value error, sep must be one character other than a line break, got ';;'"),
    ({"data": {"dataset": "synthetic", "synthetic": {"bogus": 3}}},
     "data.synthetic: Value error, unknown option 'bogus'; the synthetic data takes n_users, n_items"),
    ({"data": {"dataset": "synthetic", "synthetic": {"n_items": 1}}},
     "data.synthetic: Value error, n_items must be >= 2, got 1"),
    ({"retriever": "missing.yaml"}, "retriever: no such file "),  # was refused after the prepare stage
])
def test_a_pipeline_config_is_refused_before_any_folder_is_made(tmp_path: Path, change: dict, message: str,
                                                                capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"name": "x", "data": {"dataset": "synthetic"}, **change}))
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "a" / "artifacts")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seqrec: error: {config}: {message}")
    assert not (tmp_path / "a").exists()


def test_a_pipeline_with_extra_ranker_features_publishes_a_bundle_that_serves_them(tmp_path: Path) -> None:
    # As configs/pipeline/beauty.yaml asks; `auto` trains the MLP with them too (its ONNX export once failed).
    from service.system.loader import load_bundle

    path = _config(tmp_path, kind="auto")
    config = yaml.safe_load(path.read_text())
    config["ranker"]["features"] = ["cooc_last1", "cooc_rank", "popularity_trend", "meta_last", "meta_recent"]
    path.write_text(yaml.safe_dump(config))
    artifacts = tmp_path / "artifacts"
    assert main(["pipeline", "--config", str(path), "--out", str(artifacts), "--threads", "1", "-q"]) == 0
    record = json.loads((artifacts / "current" / "pipeline.json").read_text())
    assert record["config"]["ranker"]["features"] == config["ranker"]["features"]
    manifest = json.loads((artifacts / "current" / "ranker" / "manifest.json").read_text())
    assert manifest["features"]["dense"][-5:] == config["ranker"]["features"]
    bundle = load_bundle(artifacts / "current")  # loads the cooc table and answers a smoke query
    assert bundle.ranker is not None


@pytest.mark.parametrize("name", ["demo", "ml-100k-download", "ml-1m", "beauty"])
def test_committed_pipeline_configs_are_valid(name: str) -> None:
    root = Path(__file__).resolve().parents[3]
    config = load_pipeline_config(root / "configs" / "pipeline" / f"{name}.yaml")
    assert config.retriever is not None
    assert config.retriever.is_file()


@pytest.mark.parametrize("name", ["ml-100k-auto", "beauty-auto"])
def test_the_untuned_pipeline_configs_name_no_retriever_config(name: str) -> None:
    """The "no hand-written config" runs: the built-in defaults, searched by `seqrec tune` within a CPU budget."""
    root = Path(__file__).resolve().parents[3]
    config = load_pipeline_config(root / "configs" / "pipeline" / f"{name}.yaml")
    assert config.retriever is None
    assert not config.overrides
    assert config.tune is not None
    assert config.tune.minutes == 60
    assert config.tune.clock == "cpu"


def test_a_pipeline_without_a_retriever_config_trains_the_sized_defaults(tmp_path: Path) -> None:
    config = tmp_path / "defaults.yaml"
    config.write_text(yaml.safe_dump({
        "name": "defaults",
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}},
        "overrides": {"model.d_model": 16, "model.n_layers": 1, "model.n_heads": 2, "train.epochs": 2},
        "ranker": {"kind": "none"},
    }))
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "a"), "--threads", "1", "-q"]) == 0
    trained = json.loads((tmp_path / "a" / "current" / "config.json").read_text())
    assert trained["model"]["d_model"] == 16  # the override
    assert trained["model"]["backbone"] == "transformer"  # the rest: sized from the data (offline/jobs/sizing.py)
    assert trained["train"]["lr"] == 1e-3
    assert trained["loss"]["name"] == "full"  # 60 items: the full softmax fits


def test_an_old_pipeline_record_loads_and_writes_back_byte_for_byte() -> None:
    # pipeline.json of `seqrec demo`, written before the records were pydantic models
    text = (Path(__file__).parent / "fixtures" / "pipeline_v1.json").read_text()
    record = PublishRecord.model_validate_json(text)
    assert json.dumps(record.model_dump(), indent=2, default=str) == text
    assert record.stages["train"].info["valid_ndcg@10"] == 0.65872
    assert record.stages["train"].seconds == 64.8
    state = RunState(config_path="demo.yaml", config=record.config, started_at="20260101T000000Z",
                     stages=record.stages)
    raw = json.loads(json.dumps(state.model_dump(), default=str))
    assert list(raw) == ["config_path", "config", "started_at", "stages", "inputs"]
    assert RunState.model_validate(raw) == state
    old = {key: value for key, value in raw.items() if key != "inputs"}  # a state.json from before `inputs`
    assert RunState.model_validate(old).inputs is None  # --resume matches it on its config alone, as it did


def test_the_reader_options_a_pipeline_and_prepare_take_are_the_readers_own() -> None:
    """One declaration (ReaderOptions' fields) gives the pipeline's `data.reader` keys and `seqrec prepare`'s flags."""
    import argparse

    from offline.cli.seqrec import build_parser
    from offline.data.readers import READER_OPTIONS, ReaderOptions
    from offline.jobs.pipeline_config import DataSpec

    fields = {f.name: f.type for f in dataclasses.fields(ReaderOptions)}
    assert [o.name for o in READER_OPTIONS] == [name for name in fields if name not in ("path", "synthetic")]
    assert all(o.nullable == ("None" in str(fields[o.name])) for o in READER_OPTIONS)
    assert all(o.default == getattr(ReaderOptions(), o.name) for o in READER_OPTIONS)
    with pytest.raises(ValidationError, match="a reader takes user_col, item_col, time_col, sep, items_path"):
        DataSpec(dataset="csv", reader={"typo": "x"})
    with pytest.raises(ValidationError, match="time_col must be a string or null"):
        DataSpec(dataset="csv", reader={"time_col": 1})
    DataSpec(dataset="csv", reader={"time_col": None, "items_path": None})
    with pytest.raises(ValidationError, match="user_col must be a string, got None"):
        DataSpec(dataset="csv", reader={"user_col": None})
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    group = next(g for g in sub.choices["prepare"]._action_groups if g.title == "csv / parquet columns")
    assert [(a.option_strings, a.default, a.help) for a in group._group_actions] == [
        ([o.flag], o.default, o.help) for o in READER_OPTIONS]
    assert [a.type for a in group._group_actions] == [None, None, None, None, Path]


def test_overrides_keep_their_yaml_types() -> None:
    """`overrides: {train.grad_clip: null}` failed: the value reached the config as the string 'None'."""
    from retriever.config import load_config_with

    raw = yaml.safe_load("{model.item_features: null, train.grad_clip: null, train.lr: 0.002, train.betas: [0.8, 0.9],"
                         " train.schedule: wsd, model.d_model: 32}")
    config = load_config_with(None, raw)
    assert config.model.item_features is None
    assert config.train.grad_clip is None
    assert (config.train.lr, config.train.betas, config.train.schedule) == (0.002, (0.8, 0.9), "wsd")
    assert config.model.backbone_params()["d_model"] == 32


def test_resume_continues_a_run_only_while_its_inputs_are_unchanged(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """--resume (the cron recipe) matched the pipeline YAML only: new data resumed after the old data's prepare
    stage and published a model of the old data, and an edited retriever YAML failed every later run ('written
    with a different config')."""
    from offline.jobs.pipeline import load_pipeline_config
    from offline.jobs.pipeline_runs import new_run, resume_run

    events = tmp_path / "events.csv"
    events.write_text("user_id,item_id,timestamp\n" + "".join(f"u1,{i},{t}\n" for t, i in enumerate("abc")))
    retriever = tmp_path / "tiny.yaml"
    retriever.write_text(yaml.safe_dump(TINY_RETRIEVER))
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "data": {"dataset": "csv", "path": "events.csv"},
                                    "retriever": "tiny.yaml"}))
    artifacts, config = tmp_path / "artifacts", load_pipeline_config(path)
    run = new_run(artifacts, config, path)

    def resumed() -> Path | None:
        found = resume_run(artifacts, config)
        return None if found is None else found.folder

    assert resumed() == run.folder
    retriever.write_text(yaml.safe_dump({**TINY_RETRIEVER, "train": {**TINY_RETRIEVER["train"], "lr": 0.01}}))
    assert resumed() is None
    assert f"{run.folder}: its retriever changed since it started; starting a new run" in caplog.text
    retriever.write_text(yaml.safe_dump(TINY_RETRIEVER))
    assert resumed() == run.folder
    events.write_text(events.read_text() + "".join(f"u2,{i},{t}\n" for t, i in enumerate("abc")))
    assert resumed() is None
    assert "its data changed since it started" in caplog.text


def test_an_out_the_pipeline_cannot_publish_into_is_refused_before_any_stage(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    """A dataset's folder got current/, versions/ and work/ beside its files, exit 0; a folder named current
    failed the publish after every stage had run ('.current.N.tmp: Is a directory')."""
    from tests.tiny import prepare_tiny

    config = _config(tmp_path)
    data = prepare_tiny(tmp_path / "data")
    before = sorted(p.name for p in data.iterdir())
    capsys.readouterr()
    assert main(["pipeline", "--config", str(config), "--out", str(data), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seqrec: error: {data} already holds a prepared dataset")
    assert sorted(p.name for p in data.iterdir()) == before
    artifacts = tmp_path / "artifacts"
    (artifacts / "current").mkdir(parents=True)
    assert main(["pipeline", "--config", str(config), "--out", str(artifacts), "-q"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"seqrec: error: {artifacts / 'current'} is a folder, not the symlink seqrec publishes through; move it "
        f"away (a bundle served from here belongs in {artifacts / 'versions'}/)")
    assert sorted(p.name for p in artifacts.iterdir()) == ["current"]
