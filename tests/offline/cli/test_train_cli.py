"""`seqrec train` -> `seqrec evaluate --artifact` -> `seqrec export`, through the real CLI."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from offline.cli import main
from offline.cli.train import TRAIN_LOCK
from offline.data.prepared import load_prepared
from retriever.artifact import read_manifest
from tests.tiny import TINY, prepare_tiny, train_tiny


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tiny(tmp_path_factory.mktemp("data") / "synthetic")


@pytest.fixture(scope="module")
def artifact(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(prepared, tmp_path_factory.mktemp("artifacts") / "a")


def test_train_writes_a_self_describing_artifact(artifact: Path, prepared: Path) -> None:
    manifest = read_manifest(artifact)
    assert manifest.sha256 is not None
    assert set(manifest.sha256) == {"config.json", "retriever.pt", "item_ids.npy", "items.faiss", "history.jsonl",
                                       "catalogue.parquet", "popularity.npy", "encoder.onnx"}
    assert manifest.compiled is not None
    assert manifest.compiled["encoder"] == "onnx"
    data = load_prepared(prepared)
    popularity = np.load(artifact / "popularity.npy", allow_pickle=False)
    assert popularity.shape == (data.n_items + 1,)
    assert popularity.sum() == len(data.split().train.items)  # training positions only: no valid/test target
    assert manifest.training is not None
    assert manifest.training["epochs_run"] == 3
    assert 1 <= manifest.training["best_epoch"] <= 3
    config = json.loads((artifact / "config.json").read_text())
    assert config["model"]["d_model"] == 16
    assert config["train"]["seed"] == 3
    assert (artifact / "run" / "tb").is_dir()
    assert any((artifact / "run" / "tb").iterdir())
    history = [json.loads(line) for line in (artifact / "history.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all("NDCG@10" in h["valid"] and h["sequences_per_second"] > 0 for h in history)


def test_evaluate_artifact_dense_and_index_agree(artifact: Path, prepared: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(artifact), "--data", str(prepared)]) == 0
    result = json.loads(capsys.readouterr().out)
    manifest = read_manifest(artifact)
    for split in ("valid", "test"):
        assert set(result[split]) == {f"{m}@{k}" for m in ("HR", "NDCG", "MRR", "Recall") for k in (1, 5, 10, 20, 50)}
        assert result[split] == manifest.metrics[split]  # the artifact reproduces its training-time numbers
        assert result["index"][split] == pytest.approx(result[split], abs=1e-6)


def test_export_hnsw_keeps_the_artifact_loadable(artifact: Path, prepared: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    assert main(["export", "--artifact", str(copy), "--index", "hnsw"]) == 0
    assert json.loads((copy / "manifest.json").read_text())["index"]["kind"] == "hnsw"
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(copy), "--data", str(prepared)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["index"]["spec"]["kind"] == "hnsw"
    assert result["index"]["test"]["HR@50"] >= result["test"]["HR@50"] - 0.05


def test_export_auto_and_gpu_shard_are_recorded(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    assert main(["export", "--artifact", str(copy), "--index", "auto", "--gpu-shard"]) == 0
    spec = json.loads((copy / "manifest.json").read_text())["index"]
    assert spec["kind"] == "flat"  # a 60-item catalogue is searched exactly
    assert spec["gpu_shard"] is True
    capsys.readouterr()
    assert main(["export", "--artifact", str(tmp_path / "missing"), "--index", "auto"]) == 1
    assert "no readable manifest.json" in capsys.readouterr().err


def test_an_export_that_dies_before_the_manifest_leaves_the_artifact_as_it_was(
        artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import retriever.artifact as module
    from retriever.index import IndexSpec

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    before = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}

    def killed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed before the manifest")

    monkeypatch.setattr(module, "_write_manifest", killed)
    with pytest.raises(RuntimeError, match="killed before the manifest"):
        module.rewrite_index(copy, IndexSpec(kind="hnsw"))
    assert {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["copy"]  # the staged copy is gone


def test_export_through_current_replaces_the_version_folder_whole(artifact: Path, prepared: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # in place, items.faiss and encoder.onnx changed before the manifest: a reload or a crash in between met new
    # files under old checksums; now a staged copy replaces the folder, and `current` stays the symlink it was
    import os
    import shutil

    artifacts = tmp_path / "artifacts"
    version = artifacts / "versions" / "v1"
    shutil.copytree(artifact, version)
    version.chmod(0o755)
    (artifacts / "current").symlink_to(Path("versions") / "v1")
    assert main(["export", "--artifact", str(artifacts / "current"), "--index", "hnsw"]) == 0
    assert (artifacts / "current").is_symlink()
    assert os.readlink(artifacts / "current") == str(Path("versions") / "v1")
    assert json.loads((version / "manifest.json").read_text())["index"]["kind"] == "hnsw"
    assert version.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
    assert sorted(p.name for p in (artifacts / "versions").iterdir()) == ["v1"]  # no staging or retired folder left
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(version), "--data", str(prepared)]) == 0  # checksums all match
    assert json.loads(capsys.readouterr().out)["index"]["spec"]["kind"] == "hnsw"


@pytest.mark.parametrize(("options", "message"), [
    (["--index", "hnsw", "--hnsw-m", "0"], "index option hnsw_m must be >= 2, got 0"),
    (["--index", "ivf", "--nprobe", "0"], "index option nprobe must be >= 1, got 0"),
    (["--index", "ivf", "--nlist", "1000"], "nlist=1000 needs at least as many training vectors"),
    (["--index", "ivf", "--nlist", "4", "--pq-m", "5"], "pq_m=5 must divide the vector dimension d=16"),
    # an option of another kind was written into the manifest beside it ({'kind': 'flat', 'pq_m': 4}), exit 0
    (["--index", "flat", "--pq-m", "4"], "--pq-m applies to --index ivf, not to --index flat"),
    (["--index", "hnsw", "--nlist", "4"], "--nlist applies to --index ivf, not to --index hnsw"),
    (["--index", "ivf", "--ef-search", "64"], "--ef-search applies to --index hnsw, not to --index ivf"),
    (["--index", "auto", "--hnsw-m", "8"], "--hnsw-m applies to --index hnsw, not to --index flat (what --index auto "
     "picks for "),  # it was dropped without a word
])
def test_export_options_the_catalogue_cannot_take_are_one_line(artifact: Path, tmp_path: Path, options: list[str],
                                                               message: str, capsys: pytest.CaptureFixture) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    before = {name: (copy / name).read_bytes() for name in ("manifest.json", "items.faiss")}
    capsys.readouterr()
    assert main(["export", "--artifact", str(copy), *options]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error: ")
    assert message in err[0]
    assert {name: (copy / name).read_bytes() for name in before} == before  # the artifact is untouched


def test_training_refuses_to_overwrite_and_reports_bad_config(artifact: Path, prepared: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["train", "--data", str(prepared), "--out", str(artifact)]) == 1
    assert "already holds a retriever artifact or bundle" in capsys.readouterr().err
    # a folder given in the wrong place is named for what it is ("already holds an artifact" before)
    assert main(["train", "--data", str(prepared), "--out", str(prepared)]) == 1
    assert capsys.readouterr().err.strip() == (f"seqrec: error: {prepared} already holds a prepared dataset written "
                                               "by `seqrec prepare`; choose a new --out")
    assert main(["evaluate", "--artifact", str(prepared), "--data", str(prepared)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"seqrec: error: {prepared / 'manifest.json'}: not a seqrec.retriever/1 manifest (it is seqrec.prepared/1: a "
        "prepared dataset written by `seqrec prepare`)")
    assert main(["evaluate", "--artifact", str(artifact), "--data", str(artifact)]) == 1
    assert "not a seqrec.prepared/1 manifest (it is seqrec.retriever/1: a retriever artifact" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    (unfinished / "run").mkdir(parents=True)
    (unfinished / "run" / "last.pt").write_bytes(b"")
    assert main(["train", "--data", str(prepared), "--out", str(unfinished)]) == 1
    assert "add --resume" in capsys.readouterr().err
    assert main(["train", "--data", str(prepared), "--out", str(tmp_path / "x"), "--train.lr", "-1"]) == 1
    assert "train.lr" in capsys.readouterr().err
    assert main(["train", "--data", str(prepared), "--out", str(tmp_path / "x"), "--model.d_modle", "8"]) == 1
    assert "d_modle" in capsys.readouterr().err
    assert main(["train", "--data", str(prepared), "--out", str(tmp_path / "x"), "--loss.name", "hinge"]) == 1
    err = capsys.readouterr().err
    assert "loss.name" in err
    assert "Traceback" not in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    assert main(["train", "--config", str(bad), "--data", str(prepared), "--out", str(tmp_path / "x")]) == 1
    assert "not valid YAML" in capsys.readouterr().err


def test_two_stage_options_without_a_two_stage_evaluation_are_refused(artifact: Path, prepared: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """Each was ignored: the command printed the retriever's (or popularity's) metrics and exited 0."""
    capsys.readouterr()
    cases = [
        (["--artifact", str(artifact), "--candidates", "50"],
         f"--candidates applies to a two-stage evaluation, not to {artifact}, which holds no ranker"),
        (["--artifact", str(artifact), "--stage", "retriever", "--mask-ids"],
         "--mask-ids applies to a two-stage evaluation, not to --stage retriever"),
        (["--model", "popularity", "--stage", "two-stage", "--candidates", "50"],
         "--candidates and --stage two-stage apply to a two-stage evaluation, not to --model popularity"),
    ]
    for options, message in cases:
        assert main(["evaluate", "--data", str(prepared), *options]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [f"seqrec: error: {message}"]


def test_a_second_train_into_the_same_out_is_refused_while_the_first_runs(prepared: Path, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """Two runs on one --out would interleave their checkpoints and artifact files (the loader then refuses the
    folder on its checksums). The second is refused at once; a holder killed with SIGKILL leaves no stale lock."""
    out = tmp_path / "a"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from common.atomic import exclusive\n"
         "with exclusive(Path(sys.argv[1]), str):\n    print('held', flush=True); time.sleep(300)",
         str(out / "run" / TRAIN_LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        for resume in ([], ["--resume"]):
            assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, *resume, "-q"]) == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1, err
            assert err[0].startswith(f"seqrec: error: {out}: another seqrec train writes into it (pid {holder.pid}, "
                                     "since 20")
            assert err[0].endswith("); wait for that run to end, or choose another --out")
        assert sorted(p.name for p in out.rglob("*")) == ["run", TRAIN_LOCK]  # nothing written beside the lock
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert read_manifest(train_tiny(prepared, out)).sha256 is not None


@pytest.mark.parametrize(("overrides", "message"), [
    (["--model.n_heads", "3"], "seqrec: error: model: d_model 16 is not divisible by n_heads 3"),
    (["--model.d_model", "6"], "seqrec: error: model: RoPE needs an even head dimension: d_model 6 / n_heads 2 = 3"),
    (["--model.d_model", "-5"], "seqrec: error: model: d_model must be >= 1, got -5"),
    (["--model.max_len", "0"], "seqrec: error: model: max_len must be >= 1, got 0"),
    (["--model.d_model", "16.5"], "seqrec: error: model: d_model must be a whole number, got 16.5"),
    (["--model.d_model", "abc"], "seqrec: error: model: d_model must be a whole number, got 'abc'"),
    (["--model.d_model="], "seqrec: error: model: d_model must be a whole number, got None"),
    (["--model.n_layers", "true"], "seqrec: error: model: n_layers must be a whole number, got True"),
])
def test_model_options_that_cannot_build_a_model_are_one_line(prepared: Path, tmp_path: Path, overrides: list[str],
                                                              message: str, capsys: pytest.CaptureFixture) -> None:
    # each was an internal error (ValueError, RuntimeError) or a misleading "no training sequence" before
    capsys.readouterr()
    assert main(["train", "--data", str(prepared), "--out", str(tmp_path / "x"), *TINY, *overrides, "-q"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "x").exists()


def test_bce_over_a_one_item_catalogue_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "log.csv"
    log.write_text("user,item,ts\n" + "".join(f"u{u},only,{10 * t + u}\n" for u in range(20) for t in range(4)))
    data = tmp_path / "one"
    assert main(["prepare", "--dataset", "csv", "--path", str(log), "--user-col", "user", "--item-col", "item",
                 "--time-col", "ts", "--out", str(data), "-q"]) == 0
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "x"), *TINY, "--loss.name", "bce", "-q"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "seqrec: error: loss bce draws each position's negative from the items other than its target: it needs a "
        "catalogue of at least 2 items, this one has 1"]  # an internal RuntimeError from torch's sampler before
    assert not (tmp_path / "x").exists()  # refused before the run folder is made


def test_evaluate_refuses_an_artifact_from_another_catalogue(artifact: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    other = tmp_path / "other"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "50", "--n-items", "30", "--seed", "2",
                 "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(artifact), "--data", str(other)]) == 1
    assert "different item catalogue" in capsys.readouterr().err


def test_another_catalogue_of_the_same_size_is_named_by_what_differs(artifact: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """Two catalogues of 57 items, 3 ids apart, read "a different item catalogue (57 items) than ... (57 items)"."""
    other = tmp_path / "other"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "12", "--out", str(other), "-q"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(artifact), "--data", str(other)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: {artifact} was trained on a different item catalogue than {other}: 3 of {other}'s item ids "
        f"are not in the artifact (e.g. 'i34'); 3 of the artifact's item ids are not in {other} (e.g. 'i27')"]


def test_resume_without_a_checkpoint_refuses_a_bundle_or_a_dataset(artifact: Path, prepared: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """--resume skipped the check on --out: with no OUT/run/last.pt it trained from scratch over a published bundle
    (whose ranker was then mined from another retriever) or over a prepared dataset's manifest.json."""
    import shutil

    bundle, data = tmp_path / "bundle", tmp_path / "data"
    shutil.copytree(artifact, bundle)
    shutil.rmtree(bundle / "run")  # as a bundle the pipeline publishes: no checkpoint beside it
    shutil.copytree(prepared, data)
    before = {path: path.read_bytes() for folder in (bundle, data) for path in folder.rglob("*") if path.is_file()}
    capsys.readouterr()
    for out, kind in ((bundle, "a retriever artifact or bundle written by `seqrec train` or `seqrec pipeline`"),
                      (data, "a prepared dataset written by `seqrec prepare`")):
        assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, "--resume", "-q"]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"seqrec: error: {out} already holds {kind}; choose a new --out"]
    after = {path: path.read_bytes() for folder in (bundle, data) for path in folder.rglob("*") if path.is_file()}
    assert after == before


def test_an_out_inside_a_prepared_dataset_is_refused(prepared: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """`seqrec prepare --overwrite` replaces the dataset's folder as a whole: a model trained into it went with it."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    capsys.readouterr()
    for resume in ([], ["--resume"]):
        assert main(["train", "--data", str(data), "--out", str(data / "model"), *TINY, *resume, "-q"]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"seqrec: error: {data / 'model'} is inside {data.resolve()}, a prepared dataset written by `seqrec "
            "prepare` (`seqrec prepare --overwrite` replaces that folder as a whole); choose a --out outside it"]
    assert not (data / "model").exists()


def test_item_features_from_a_metadata_column(prepared: Path, tmp_path: Path) -> None:
    from offline.data.features import item_feature_matrix
    from offline.data.prepared import load_prepared
    from retriever.artifact import load_artifact

    data = load_prepared(prepared)
    matrix, n_features = item_feature_matrix(data, "genres")
    genres = data.items.column("genres").to_pylist()
    assert matrix.shape[0] == data.n_items + 1
    assert not matrix[0].any()
    assert n_features == len({g for row in genres for g in row})
    assert [int((row != 0).sum()) for row in matrix[1:]] == [len(row) for row in genres]

    out = tmp_path / "with-features"
    assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, "--train.epochs", "1",
                 "--model.item_features", "genres", "-q"]) == 0
    artifact = load_artifact(out)
    assert artifact.config.model.backbone_params()["n_features"] == n_features
    assert torch.equal(artifact.model.encoder.item_features, torch.from_numpy(matrix))  # type: ignore[attr-defined]
    assert main(["train", "--data", str(prepared), "--out", str(tmp_path / "bad"), *TINY,
                 "--model.item_features", "colour", "-q"]) == 1


def test_eval_users_validates_and_reports_on_a_fixed_user_sample(prepared: Path, artifact: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from offline.evaluation.retriever import dense_metrics, evaluation_sample
    from retriever.artifact import load_artifact

    out = tmp_path / "sampled"
    assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, "--train.eval_users", "40", "-q"]) == 0
    manifest, full = read_manifest(out), read_manifest(artifact)
    assert manifest.training is not None
    assert full.training is not None
    assert manifest.training["evaluated_users"] == 40
    assert full.training["evaluated_users"] == 150
    # What decides a CPU run's last digits besides the seed is recorded beside its figures.
    import torch

    host = manifest.training["host"]
    assert (host["torch"], host["cpu_capability"]) == (torch.__version__, torch.backends.cpu.get_cpu_capability())
    assert isinstance(host["threads"], int)
    assert host["threads"] >= 1
    # The reported metrics are those of the sampled users, recomputed here from the saved weights.
    data = load_prepared(prepared)
    model = load_artifact(out, with_index=False).model
    sample = evaluation_sample(data.split(), 40, 3)
    max_len = json.loads((out / "config.json").read_text())["model"]["max_len"]
    expected = dense_metrics(model, sample, data.n_items, max_len, exclude_seen=manifest.exclude_seen)
    for split in ("valid", "test"):
        assert manifest.metrics[split]["NDCG@10"] == pytest.approx(expected[split]["NDCG@10"], abs=1e-6)


@pytest.mark.parametrize("content", ["- model\n- train\n", "just a string\n", b"\xff\xfe\x00", None],
                         ids=["list", "string", "not-utf8", "folder"])
def test_a_config_that_is_not_a_mapping_is_a_one_line_error(prepared: Path, tmp_path: Path, content: str | bytes | None,
                                                            capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "config.yaml"
    if content is None:
        config.mkdir()
    elif isinstance(content, bytes):
        config.write_bytes(content)
    else:
        config.write_text(content)
    outs = [tmp_path / "a", tmp_path / "t", tmp_path / "p"]
    commands = [["train", "--config", str(config), "--data", str(prepared), "--out", str(outs[0])],
                ["tune", "--config", str(config), "--data", str(prepared), "--trials", "1", "--out", str(outs[1])],
                ["pipeline", "--config", str(config), "--out", str(outs[2])]]
    for argv in commands:
        capsys.readouterr()
        assert main(argv) == 1, argv[0]
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"seqrec: error: {config}: "), (argv[0], err)
        assert "internal error" not in err[-1]
        assert "Traceback" not in "\n".join(err)
        assert not any(out.exists() for out in outs)
