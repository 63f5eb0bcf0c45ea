"""`seqrec bench two-stage`: the ranker table's rows are the bundles' own figures, over seeds."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from offline.bench.quality.two_stage import results_table, summarize_seeds, write_results
from offline.cli import main
from tests.tiny import prepare_tiny

TINY_YAML = """\
model: {backbone: transformer, d_model: 16, n_layers: 1, n_heads: 2, max_len: 10}
train: {epochs: 3, batch_size: 64, threads: 1}
"""


def _record(seed: int, value: float) -> dict:
    metrics = {"HR@10": 2 * value, "NDCG@10": value}
    rows = {name: {"valid": metrics, "test": metrics} for name in ("retriever", "mlp", "lgbm", "mlp_ids_masked")}
    rows["retriever"] = {"valid": {"HR@10": 0.2, "NDCG@10": 0.1}, "test": {"HR@10": 0.2, "NDCG@10": 0.1}}
    rows["recall@100"] = {s: {"recall@100": 0.5} for s in ("valid", "test")}
    return {"seed": seed, "depth": 100, "repeats": "exclude", "repeat_targets": {"valid": 0.0, "test": 0.0},
            "auto_choice": "mlp", "rows": rows}


def test_mean_and_sample_std_over_seeds_written_out_by_hand() -> None:
    summary = summarize_seeds([_record(42, 0.1), _record(123, 0.3)])
    # 0.1 and 0.3: mean 0.2, sample std sqrt((0.1² + 0.1²) / 1) = 0.141421...
    assert summary["rows"]["mlp"]["test"]["NDCG@10"] == pytest.approx({"mean": 0.2, "std": 0.02 ** 0.5})
    table = results_table(summary)
    assert "| retriever + MLP ranker | 0.4000 ± 0.2828 | 0.2000 ± 0.1414 | 0.2000 ± 0.1414 | 2.00x |" in table
    assert "| retriever recall@100 (the two-stage ceiling) | 0.5000 ± 0.0000 |  | 0.5000 ± 0.0000 (valid) |  |" in table
    with pytest.raises(Exception, match="depth"):
        summarize_seeds([_record(42, 0.1), {**_record(123, 0.3), "depth": 50}])
    # Seeds ranked with other extra features are not averaged together (a record from before --features has none).
    with pytest.raises(Exception, match="extra features"):
        summarize_seeds([_record(42, 0.1), {**_record(123, 0.3), "features": ["cooc_last1"]}])
    extras = [{**_record(s, 0.1), "features": ["cooc_last1", "popularity_trend"]} for s in (42, 123)]
    assert summarize_seeds(extras)["features"] == ["cooc_last1", "popularity_trend"]
    assert summary["features"] == []
    # Nor are seeds whose MLP ranker is an ensemble averaged with single-network ones.
    with pytest.raises(Exception, match="MLP members"):
        summarize_seeds([_record(42, 0.1), {**_record(123, 0.3), "mlp_members": 3}])
    assert summary["mlp_members"] == 1
    with pytest.raises(Exception, match="MLP ID dropout"):
        summarize_seeds([_record(42, 0.1), {**_record(123, 0.3), "mlp_id_dropout": 0.1}])
    assert summary["mlp_id_dropout"] == 0.3  # a record written before the flag: the default it trained with
    with pytest.raises(Exception, match="input scaling"):
        summarize_seeds([_record(42, 0.1), {**_record(123, 0.3), "mlp_scaling": 2}])


def test_unknown_extra_feature_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = prepare_tiny(tmp_path / "data")
    args = ["bench", "two-stage", "--artifact", str(tmp_path / "none"), "--data", str(data), "--out", str(tmp_path),
            "--features", "cooc_last1,age"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "unknown ranker features ['age']" in err
    assert "Traceback" not in err


def test_results_are_written_into_an_out_folder_nothing_made_yet(tmp_path: Path) -> None:
    # With --work elsewhere, the bench's first write into OUT is the results themselves.
    out = tmp_path / "not" / "made"
    write_results(out, [_record(42, 0.1)], "seqrec bench two-stage ...")
    assert json.loads((out / "results.json").read_text())["seeds"] == [42]
    text = (out / "results.md").read_text()
    assert "Reproduce: `seqrec bench two-stage ...`" in text
    assert "holdout mining (2 training targets per user" in text
    assert "second-to-last training item" in text
    write_results(out, [{**_record(42, 0.1), "mining": {"per_user": 5}}], "seqrec bench two-stage ...")
    text = (out / "results.md").read_text()
    assert "holdout mining (5 training targets per user" in text
    assert "training item 5 from the end" in text
    assert "extra features" not in text
    write_results(out, [{**_record(42, 0.1), "features": ["cooc_last3", "cooc_rank"]}], "seqrec bench two-stage ...")
    assert "`seqrec train-ranker` defaults plus the extra features cooc_last3, cooc_rank," in (
        out / "results.md").read_text()
    write_results(out, [{**_record(42, 0.1), "mlp_members": 3}], "seqrec bench two-stage ...")
    assert "defaults, the MLP an ensemble of 3 networks (mean logit)," in (out / "results.md").read_text()
    write_results(out, [{**_record(42, 0.1), "mlp_id_dropout": 0.3}], "seqrec bench two-stage ...")
    assert "defaults, the MLP's ID dropout 0.3," in (out / "results.md").read_text()


def test_two_stage_bench_reuses_the_holdout_retriever_and_reports_the_bundles_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = prepare_tiny(tmp_path / "data")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_YAML)
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    assert main(["train", "--config", str(config), "--data", str(data), "--out", str(bundle), "--seed", "3",
                 "--threads", "1", "-q"]) == 0
    # The holdout retriever trains from the YAML alone (beside the retriever) and is reused below.
    assert main(["bench", "two-stage", "--holdout-only", "--config", str(config), "--seeds", "3", "--data", str(data),
                 "--out", str(out), "--threads", "1", "-q"]) == 0
    holdout = out / "runs" / "seed3" / "mining" / "holdout-retriever" / "manifest.json"
    version = json.loads(holdout.read_text())["version"]
    args = ["bench", "two-stage", "--artifact", str(bundle), "--data", str(data), "--out", str(out), "--depth", "20",
            "--threads", "1", "-q"]
    assert main(args) == 0
    assert json.loads(holdout.read_text())["version"] == version
    result = json.loads((out / "results.json").read_text())
    # The tiny synthetic data is repeat-heavy, so the bundle's "auto" policy resolved to allow.
    assert (result["seeds"], result["depth"], result["repeats"]) == ([3], 20, "allow")
    record = result["per_seed"][0]
    retriever = json.loads((bundle / "manifest.json").read_text())
    assert record["rows"]["retriever"]["test"] == retriever["metrics"]["test"]
    for kind in ("mlp", "lgbm"):
        ranker = json.loads((out / "runs" / "seed3" / kind / "ranker" / "manifest.json").read_text())
        assert ranker["kind"] == kind
        assert record["rows"][kind]["test"] == ranker["metrics"]["test"]
    lgbm = json.loads((out / "runs" / "seed3" / "lgbm" / "ranker" / "manifest.json").read_text())
    assert record["lgbm_inputs_sha256"] == lgbm["config"]["inputs_sha256"]  # what LightGBM was fitted on
    assert record["host"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # the ISA the rankers ran on
    mlp = json.loads((out / "runs" / "seed3" / "mlp" / "ranker" / "manifest.json").read_text())
    assert record["rows"]["mlp_ids_masked"] == mlp["metrics"]["ids_masked"]
    valid = {k: record["rows"][k]["valid"]["NDCG@10"] for k in ("mlp", "lgbm")}
    assert record["auto_choice"] == max(valid, key=valid.__getitem__)
    text = (out / "results.md").read_text()
    assert f"Repeat policy `{result['repeats']}`" in text
    assert "Candidate depth 20" in text
    assert "seqrec bench two-stage --artifact" in text
    # A rerun trains nothing and writes the same figures.
    capsys.readouterr()
    assert main(args) == 0
    assert json.loads((out / "results.json").read_text())["rows"] == result["rows"]
    # Nor does it pass off these groups as mined with another --holdout-per-user.
    capsys.readouterr()
    assert main([*args, "--holdout-per-user", "3"]) == 1
    assert "--holdout-per-user" in capsys.readouterr().err
    # Nor as ranked with extra features; those go to another --work, which may reuse the mined groups.
    assert main([*args, "--features", "cooc_last1"]) == 1
    assert "--features" in capsys.readouterr().err
    assert main([*args, "--mlp-members", "2"]) == 1
    assert "--mlp-members" in capsys.readouterr().err
    assert main([*args, "--mlp-id-dropout", "0.3"]) == 1
    assert "--mlp-id-dropout" in capsys.readouterr().err
    assert main([*args, "--mlp-id-dropout", "1.5"]) == 1
    assert "--mlp-id-dropout must be in [0, 1)" in capsys.readouterr().err
    # A seed ranked before the MLP input-scaling fix (its record has no "mlp_scaling") is not reused.
    record_path = out / "runs" / "seed3" / "record.json"
    saved = record_path.read_text()
    record_path.write_text(json.dumps({k: v for k, v in json.loads(saved).items() if k != "mlp_scaling"}))
    assert main(args) == 1
    assert "before the MLP input-scaling fix" in capsys.readouterr().err
    record_path.write_text(saved)
    extra = tmp_path / "extra"
    shutil.copytree(out / "runs" / "seed3" / "mining", extra / "runs" / "seed3" / "mining")
    extra_args = ["bench", "two-stage", "--artifact", str(bundle), "--data", str(data), "--out", str(extra),
                  "--depth", "20", "--threads", "1", "-q", "--features", "cooc_last1,popularity_trend"]
    assert main(extra_args) == 0
    assert json.loads(holdout.read_text())["version"] == version
    with_extras = json.loads((extra / "results.json").read_text())
    assert with_extras["features"] == ["cooc_last1", "popularity_trend"]
    assert with_extras["per_seed"][0]["mining"] == record["mining"]  # the same groups
    assert with_extras["rows"]["retriever"] == result["rows"]["retriever"]
    for kind in ("mlp", "lgbm"):
        ranker = json.loads((extra / "runs" / "seed3" / kind / "ranker" / "manifest.json").read_text())
        assert ranker["features"]["dense"][-2:] == ["cooc_last1", "popularity_trend"]
        assert with_extras["per_seed"][0]["rows"][kind]["test"] == ranker["metrics"]["test"]
    assert "--features cooc_last1,popularity_trend" in with_extras["command"]
