"""`seqrec bench` and `seqrec bench latency`: tables, aggregation, FLOPs, resume, failures, budget."""

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import offline.jobs.train
from offline.bench.lib.measure import fit_alpha, forward_flops
from offline.bench.quality.records import RunRecord, config_sha256
from offline.bench.quality.results import TABLE_METRICS, csv_text, mean_std, summarize
from offline.bench.quality.results import results_table as markdown_table
from offline.cli import main
from retriever.artifact import read_manifest
from retriever.backbones import backbone_config, build_encoder

TINY = "model: {{backbone: {backbone}, max_len: 10, d_model: 8, n_layers: 1, n_heads: {heads}{extra}}}\n" \
       "loss: {{name: full}}\ntrain: {{batch_size: 64, epochs: 3, threads: 1}}\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A prepared folder named "tiny" and a configs folder with configs/tiny/{sasrec,transformer,broken}.yaml."""
    root = tmp_path_factory.mktemp("bench")
    data = root / "tiny"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "80", "--n-items", "40", "--mean-length", "10",
                 "--seed", "1", "--out", str(data), "-q"]) == 0
    configs = root / "configs" / "tiny"
    configs.mkdir(parents=True)
    (configs / "sasrec.yaml").write_text(TINY.format(backbone="sasrec", heads=1, extra=""))
    genres = TINY.format(backbone="transformer", heads=2, extra=", item_features: genres")
    (configs / "transformer.yaml").write_text(genres)
    # Fails inside training (the data has no such column), after the config itself validated.
    (configs / "broken.yaml").write_text(genres.replace("genres", "colour"))
    return data, root / "configs"


def _bench(setup: tuple[Path, Path], out: Path, *extra: str, models: str = "sasrec,transformer,broken") -> int:
    data, configs = setup
    return main(["bench", "--data", str(data), "--models", models, "--seeds", "1,2", "--out", str(out),
                 "--configs-dir", str(configs), "--max-epochs", "1", "-q", *extra])


@pytest.fixture(scope="module")
def bench(setup: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results") / "tiny"
    assert _bench(setup, out) == 1  # "broken" fails: the tables hold the others, the exit status says so
    return out


def test_mean_and_sample_std() -> None:
    assert mean_std([0.1, 0.2, 0.3]) == {"mean": pytest.approx(0.2), "std": pytest.approx(0.1)}
    assert mean_std([2.0, 4.0]) == {"mean": 3.0, "std": pytest.approx(math.sqrt(2), abs=1e-6)}
    assert mean_std([0.5]) == {"mean": 0.5, "std": None}  # one seed: no spread to report


def _record(model: str, seed: int, ndcg: float, *, backbone: str = "sasrec", flops: float = 100.0) -> dict[str, Any]:
    metrics = {m: ndcg for m in TABLE_METRICS}
    return {"model": model, "seed": seed, "backbone": backbone, "max_len": 10, "params": 1000, "flops": flops,
            "seconds_per_epoch": 2.0 * seed, "best_epoch": seed, "seconds_to_best": 1.0, "inference_ms": 5.0,
            "average_steps": None, "test": metrics, "valid": {**metrics, "NDCG@10": ndcg + 0.1}}


def test_summary_of_known_seed_values() -> None:
    records = [
        _record("deep", 1, 0.30, backbone="transformer", flops=300.0),
        _record("deep", 2, 0.10, backbone="transformer", flops=300.0),
        _record("sasrec", 1, 0.20), _record("sasrec", 2, 0.20), _record("sasrec", 3, 0.0) | {"error": "boom"},
        {"model": "dead", "seed": 1, "error": "ValueError: no"},
        {"model": "dead", "seed": 2, "error": "ValueError: no"},
    ]
    deep, sasrec, dead = summarize([RunRecord.model_validate(r) for r in records])
    assert deep["test"]["NDCG@10"] == {"mean": pytest.approx(0.2), "std": pytest.approx(math.sqrt(0.02), abs=1e-6)}
    assert deep["valid"]["NDCG@10"]["mean"] == pytest.approx(0.3)
    assert deep["seconds_per_epoch"] == {"mean": 3.0, "std": pytest.approx(math.sqrt(2), abs=1e-6)}
    assert deep["relative_flops"] == pytest.approx(3.0)  # SASRec is the reference even when listed later
    assert sasrec["relative_flops"] == 1.0
    assert sasrec["seeds"] == [1, 2]
    assert sasrec["test"]["NDCG@10"] == {"mean": 0.2, "std": 0.0}
    assert sasrec["notes"] == "seed 3 failed: boom"
    assert dead["error"] == "ValueError: no"
    assert dead["notes"] == ""  # the same error on every seed is said once, in the error cell
    table = markdown_table([deep, sasrec, dead], "test").splitlines()
    assert table[0].startswith("| Model | Params | FLOPs (rel.) | HR@1 | HR@5 | HR@10 | HR@50 | NDCG@1 |")
    assert "| 3.00× |" in table[2]
    assert "| 0.2000 ± 0.1414 |" in table[2]
    assert table[4].endswith("| **error**: ValueError: no |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    rows = list(csv.DictReader(csv_text([deep, sasrec, dead]).splitlines()))
    assert float(rows[0]["test_NDCG@10_mean"]) == pytest.approx(0.2)
    assert float(rows[0]["test_NDCG@10_std"]) == pytest.approx(math.sqrt(0.02), abs=1e-6)
    assert rows[2]["error"] == "ValueError: no"
    assert rows[2]["test_NDCG@10_mean"] == ""


def test_flop_count_matches_the_hand_count() -> None:
    # SASRec, d 8, one head, one layer, 10 positions: q, kv, out and the two FFN layers are
    # 2 * T * D * (D + 2D + D + D + D) = 12 T D^2 FLOPs; QK^T and AV are 2 * 2 * T^2 * D.
    encoder = build_encoder("sasrec", backbone_config("sasrec", 40, {"max_len": 10, "d_model": 8, "n_layers": 1,
                                                                       "n_heads": 1}))
    assert forward_flops(encoder.eval(), 10, 40) == 12 * 10 * 8**2 + 4 * 10**2 * 8


def test_bench_writes_the_three_tables_and_the_configs(bench: Path) -> None:
    result = json.loads((bench / "results.json").read_text())
    assert result["seeds"] == [1, 2]
    assert result["max_epochs"] == 1
    rows = {row["model"]: row for row in result["models"]}
    assert list(rows) == ["sasrec", "transformer", "broken"]
    assert rows["sasrec"]["relative_flops"] == 1.0
    assert rows["transformer"]["relative_flops"] > 1.0
    assert rows["sasrec"]["params"]["std"] == 0.0
    for name in ("sasrec", "transformer"):
        runs = [r for r in result["runs"] if r["model"] == name]
        assert [r["epochs_run"] for r in runs] == [1, 1]  # --max-epochs capped the configs' 3 epochs
        ndcg = [r["test"]["NDCG@10"] for r in runs]
        assert rows[name]["test"]["NDCG@10"]["mean"] == pytest.approx(np.mean(ndcg), abs=1e-6)
        assert rows[name]["test"]["NDCG@10"]["std"] == pytest.approx(np.std(ndcg, ddof=1), abs=1e-6)
        assert set(TABLE_METRICS) <= set(rows[name]["valid"])
        assert rows[name]["inference_ms"]["mean"] > 0
    assert "no column 'colour'" in rows["broken"]["error"]

    markdown = (bench / "results.md").read_text()
    assert "| Model | Params | FLOPs (rel.) | HR@1 | HR@5 | HR@10 | HR@50 | NDCG@1 | NDCG@5 | NDCG@10 | NDCG@50 | " \
           "MRR@1 | MRR@5 | MRR@10 | MRR@50 | s / epoch | best epoch | ms / batch | notes |" in markdown
    assert "| sasrec | " in markdown
    assert "| 1.00× |" in markdown
    assert "**error**: DataError" in markdown
    assert "## Validation" in markdown
    table = list(csv.DictReader((bench / "results.csv").read_text().splitlines()))
    assert [r["model"] for r in table] == ["sasrec", "transformer", "broken"]
    assert {"test_HR@50_mean", "test_MRR@1_std", "valid_NDCG@10_mean", "params_mean", "seconds_per_epoch_mean",
            "best_epoch_mean", "inference_ms_mean", "relative_flops", "notes", "error"} <= set(table[0])
    assert float(table[0]["relative_flops"]) == 1.0
    resolved = (bench / "configs" / "transformer.yaml").read_text()
    assert "epochs: 1" in resolved
    assert "item_features: genres" in resolved
    assert (bench / "runs" / "sasrec" / "seed2" / "manifest.json").exists()


def test_rerun_skips_finished_runs_and_resumes_unfinished_ones(setup: tuple[Path, Path], bench: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    out = tmp_path / "again"
    shutil.copytree(bench, out)
    before = json.loads((out / "results.json").read_text())
    unfinished = out / "runs" / "transformer" / "seed2"
    (unfinished / "manifest.json").unlink()  # killed after training, before the artifact was written
    calls: list[tuple[str, bool]] = []
    train = offline.jobs.train.train_retriever

    def counting(config: Any, data: Any, run_dir: Path, *, resume: bool = False, **kwargs: Any) -> Any:
        calls.append((str(run_dir.relative_to(out)), resume))
        return train(config, data, run_dir, resume=resume, **kwargs)

    monkeypatch.setattr(offline.jobs.train, "train_retriever", counting)
    assert _bench(setup, out) == 1  # "broken" still fails
    # Only the unfinished run (resumed from its checkpoint) and the failing model, which is retried, train again.
    assert calls == [("runs/transformer/seed2", True), ("runs/broken/seed1", False), ("runs/broken/seed2", False)]
    after = json.loads((out / "results.json").read_text())
    assert after["models"][0] == before["models"][0]
    assert after["models"][1]["test"] == before["models"][1]["test"]

    assert _bench(setup, out, "--set", "train.lr=0.01", models="sasrec") == 1  # finished runs, other config
    row = json.loads((out / "results.json").read_text())["models"][0]
    assert "another config" in row["error"]


def test_budget_stops_after_the_epoch_that_crosses_it(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, configs = setup
    # eval_every 2 would skip validating epoch 1; the budget's last epoch is validated all the same.
    assert main(["bench", "--data", str(data), "--models", "sasrec", "--seeds", "1", "--out", str(tmp_path),
                 "--configs-dir", str(configs), "--budget-minutes", "1e-6", "--set", "train.eval_every=2",
                 "-q"]) == 0
    run = tmp_path / "runs" / "sasrec" / "seed1"
    training = read_manifest(run).training
    assert training is not None
    assert training["epochs_run"] == 1
    assert training["best_epoch"] == 1
    assert json.loads((run / "config.json").read_text())["train"]["budget_minutes"] == 1e-6
    assert "1e-06 min wall-clock budget" in (tmp_path / "results.md").read_text()


def test_unknown_model_names_the_configs_there_are(setup: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert _bench(setup, tmp_path, models="sasrec,nope") == 1
    err = capsys.readouterr().err
    assert "nope" in err
    assert "broken, sasrec, transformer" in err


def test_alpha_is_the_log_log_slope() -> None:
    lengths = [64, 128, 256, 512, 1024, 1536]
    assert fit_alpha(lengths, [0.003 * n**1.26 for n in lengths]) == pytest.approx(1.26)
    assert fit_alpha(lengths, [7.0] * len(lengths)) == pytest.approx(0.0, abs=1e-12)
    noisy = [2e-5 * n**2 * f for n, f in zip(lengths, [1.05, 0.95, 1.05, 0.95, 1.05, 0.95], strict=True)]
    assert fit_alpha(lengths, noisy) == pytest.approx(2.0, abs=0.05)


def test_latency_bench_writes_json_markdown_and_a_png(setup: tuple[Path, Path], tmp_path: Path) -> None:
    from matplotlib.image import imread

    _, configs = setup
    assert main(["bench", "latency", "--models", "sasrec,transformer", "--dataset-name", "tiny", "--configs-dir",
                 str(configs), "--lengths", "4,8,16", "--batch", "2", "--reps", "2", "--warmup", "1",
                 "--n-items", "50", "--out", str(tmp_path), "-q"]) == 0
    result = json.loads((tmp_path / "latency.json").read_text())
    assert result["weights"] == "randomly initialised"
    for curve in result["models"]:
        assert [p["length"] for p in curve["points"]] == [4, 8, 16]
        assert all(p["ms"] > 0 and p["sequences_per_second"] > 0 for p in curve["points"])
        assert curve["alpha"] == pytest.approx(fit_alpha([4, 8, 16], [p["ms"] for p in curve["points"]]), abs=1e-3)
    assert "randomly initialised weights" in (tmp_path / "latency.md").read_text()
    png = tmp_path / "latency.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(png)
    assert image.ndim == 3
    assert image.shape[0] > 100
    assert image.shape[1] > 100


def test_merge_makes_one_table_from_two_outputs_without_retraining(setup: tuple[Path, Path], bench: Path,
                                                                   tmp_path: Path) -> None:
    """sasrec in one output, transformer in another: the merged table equals the one-command table."""
    whole = json.loads((bench / "results.json").read_text())
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, models in ((first, {"sasrec"}), (second, {"transformer", "broken"})):
        folder.mkdir()
        part = {**whole, "runs": [r for r in whole["runs"] if r["model"] in models]}
        (folder / "results.json").write_text(json.dumps(part))
    out = tmp_path / "merged"
    assert main(["bench", "merge", "--from", str(first), "--from", str(second), "--out", str(out),
                 "--remark", "A remark about these runs.", "-q"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["models"] == whole["models"]  # relative FLOPs still against sasrec, which came from one source
    assert merged["runs"] == whole["runs"]
    markdown = (out / "results.md").read_text()
    assert "A remark about these runs." in markdown
    again = tmp_path / "again"  # a merge of the merged table keeps its remark and adds the new one
    assert main(["bench", "merge", "--from", str(out), "--remark", "Another.", "--out", str(again), "-q"]) == 0
    assert json.loads((again / "results.json").read_text())["remarks"] == ["A remark about these runs.", "Another."]
    assert "seqrec bench merge --from" in markdown
    assert markdown.split("## Test")[1].split("## Validation")[0] == \
        (bench / "results.md").read_text().split("## Test")[1].split("## Validation")[0]


def test_merge_min_seeds_keeps_complete_rows_only(bench: Path, tmp_path: Path) -> None:
    whole = json.loads((bench / "results.json").read_text())
    part = tmp_path / "part"
    part.mkdir()
    runs = [r for r in whole["runs"] if not (r["model"] == "transformer" and r["seed"] == 2)]
    (part / "results.json").write_text(json.dumps({**whole, "runs": runs}))
    out = tmp_path / "complete"
    assert main(["bench", "merge", "--from", str(part), "--min-seeds", "2", "--out", str(out), "-q"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert [row["model"] for row in merged["models"]] == ["sasrec"]  # transformer has 1 seed, broken failed
    assert "--min-seeds 2" in merged["command"]
    # none with 5: it wrote an empty table and exited 0
    assert main(["bench", "merge", "--from", str(part), "--min-seeds", "5", "--out", str(tmp_path / "none"),
                 "-q"]) == 1
    assert not (tmp_path / "none").exists()


def test_merge_models_keeps_only_those_runs_and_their_configs(bench: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The same output twice: every run is a duplicate, but only transformer's are read from the second.
    first = json.loads((bench / "results.json").read_text())
    second = tmp_path / "second"
    second.mkdir()
    (second / "results.json").write_text(json.dumps({**first, "runs": [r for r in first["runs"]
                                                                       if r["model"] == "transformer"]}))
    out = tmp_path / "only"
    assert main(["bench", "merge", "--from", str(second), "--models", "transformer", "--out", str(out), "-q"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert {r["model"] for r in merged["runs"]} == {"transformer"}
    assert [row["model"] for row in merged["models"]] == ["transformer"]
    assert "--models transformer" in merged["command"]
    assert main(["bench", "merge", "--from", str(bench), "--from", str(second), "--models", "sasrec",
                 "--out", str(tmp_path / "sasrec"), "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "sasrec" / "configs").iterdir()) == ["sasrec.yaml"]
    assert main(["bench", "merge", "--from", str(bench), "--models", "nosuch", "--out", str(tmp_path / "x")]) == 1
    assert "no runs of nosuch" in capsys.readouterr().err


def test_merge_refuses_other_data_and_a_run_twice(bench: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    whole = json.loads((bench / "results.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({**whole, "items": whole["items"] + 1}))
    assert main(["bench", "merge", "--from", str(bench), "--from", str(other), "--out", str(tmp_path / "o")]) == 1
    assert "items=" in capsys.readouterr().err
    assert main(["bench", "merge", "--from", str(bench), "--from", str(bench), "--out", str(tmp_path / "o")]) == 1
    assert "seed 1 is in both" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.md").exists()


def test_a_finished_run_from_before_a_config_key_was_added_is_still_the_same_config() -> None:
    from offline.bench.quality.models import same_config
    from retriever.config import config_from_dict

    resolved = config_from_dict({"model": {"backbone": "sasrec", "max_len": 10}}).model_dump(mode="json")
    stored = json.loads(json.dumps(resolved))
    del stored["train"]["eval_users"]  # as an artifact written before the key existed has it
    assert same_config(resolved, stored)
    stored["train"]["lr"] = 0.5
    assert not same_config(resolved, stored)
    assert not same_config(resolved, {"model": {"backbone": "no-such-backbone"}})


def test_each_run_records_the_hash_of_its_config_without_the_seed(bench: Path) -> None:
    runs = {(r["model"], r["seed"]): r for r in json.loads((bench / "results.json").read_text())["runs"]}
    for (model, seed), record in runs.items():
        # The bench hashes the config it resolved; the run folder's config.json, written by training with the
        # data-derived model keys (transformer reads genres), hashes the same.
        if model != "broken":  # failed in training, before writing its run folder
            stored = json.loads((Path(record["run"]) / "config.json").read_text())
            assert stored["train"]["seed"] == seed
            assert record["config_sha256"] == config_sha256(stored)
    assert "n_features" in json.loads((Path(runs["transformer", 1]["run"]) / "config.json").read_text())["model"]
    for model in ("sasrec", "transformer", "broken"):
        assert runs[model, 1]["config_sha256"] == runs[model, 2]["config_sha256"]
    assert runs["sasrec", 1]["config_sha256"] != runs["transformer", 1]["config_sha256"]


@pytest.fixture(scope="module")
def other_lr(setup: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sasrec's seeds again with another learning rate: the same model name, another config."""
    out = tmp_path_factory.mktemp("results") / "lr"
    assert _bench(setup, out, "--set", "train.lr=0.002", models="sasrec") == 0
    return out


def _one_seed_each(first: Path, second: Path, folder: Path, *, strip: bool = False) -> Path:
    """sasrec seed 1 from ``first``, seed 2 from ``second``, as two merge sources; ``strip`` drops their hashes."""
    folder.mkdir()
    for name, source, seed in (("a", first, 1), ("b", second, 2)):
        whole = json.loads((source / "results.json").read_text())
        runs = [{k: v for k, v in r.items() if not (strip and k == "config_sha256")}
                for r in whole["runs"] if r["model"] == "sasrec" and r["seed"] == seed]
        (folder / name).mkdir()
        (folder / name / "results.json").write_text(json.dumps({**whole, "runs": runs}))
    return folder


def test_merge_refuses_runs_of_one_model_made_with_different_configs(bench: Path, other_lr: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for strip in (False, True):  # records with their hash, and older ones whose hash comes from the run folder
        parts = _one_seed_each(bench, other_lr, tmp_path / f"parts-{strip}", strip=strip)
        out = tmp_path / f"o-{strip}"
        assert main(["bench", "merge", "--from", str(parts / "a"), "--from", str(parts / "b"), "--out", str(out),
                     "-q"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "different configs" in err
        assert f"sasrec seed 1 in {parts / 'a' / 'results.json'} and seed 2 in {parts / 'b' / 'results.json'}" in err
        assert not (out / "results.md").exists()
    same = _one_seed_each(bench, bench, tmp_path / "same", strip=True)  # hashes recomputed, equal: merged
    assert main(["bench", "merge", "--from", str(same / "a"), "--from", str(same / "b"), "--out",
                 str(tmp_path / "ok"), "-q"]) == 0
    runs = json.loads((tmp_path / "ok" / "results.json").read_text())["runs"]
    whole = {r["seed"]: r for r in json.loads((bench / "results.json").read_text())["runs"] if r["model"] == "sasrec"}
    assert [r["config_sha256"] for r in runs] == [whole[1]["config_sha256"], whole[2]["config_sha256"]]


def test_merge_of_unhashed_runs_without_their_folders_warns_and_merges_as_before(
        bench: Path, other_lr: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    parts = _one_seed_each(bench, other_lr, tmp_path / "parts", strip=True)
    for name in ("a", "b"):  # the run folders are gone: nothing to hash, nothing to check
        path = parts / name / "results.json"
        whole = json.loads(path.read_text())
        path.write_text(json.dumps({**whole, "runs": [{**r, "run": str(tmp_path / "gone")} for r in whole["runs"]]}))
    with caplog.at_level("WARNING"):
        assert main(["bench", "merge", "--from", str(parts / "a"), "--from", str(parts / "b"), "--out",
                     str(tmp_path / "o")]) == 0
    assert "merged without checking" in caplog.text
    assert "sasrec seeds 1, 2" in caplog.text
    runs = json.loads((tmp_path / "o" / "results.json").read_text())["runs"]
    assert [r["seed"] for r in runs] == [1, 2]
    assert not any("config_sha256" in r for r in runs)


def test_a_bench_whose_runs_all_fail_exits_1_with_its_tables(setup: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert _bench(setup, tmp_path, models="broken") == 1
    assert "2 of 2 runs failed" in capsys.readouterr().err
    rows = json.loads((tmp_path / "results.json").read_text())["models"]
    assert [row["model"] for row in rows] == ["broken"]
    assert "no column 'colour'" in rows[0]["error"]
