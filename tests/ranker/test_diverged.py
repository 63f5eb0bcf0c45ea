"""A ranker whose scores are NaN is never ranked: training refuses it, --kind auto leaves it out, evaluation
of a bundle holding one says so (NaN compared false both ways, so every target ranked first: NDCG@10 = inf)."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import SeqrecError
from offline.cli import main
from offline.data.prepared import load_prepared
from offline.jobs.tables import item_tables
from ranker.artifact import write_ranker
from ranker.config import MLPConfig
from ranker.mlp import MLPRanker
from ranker.train import UnrankableScores, served_order_ranks
from retriever.artifact import load_artifact

DIRECT = ["--mining", "direct", "--depth", "20", "--epochs", "2", "--threads", "1", "-q"]


def _strict_json(text: str) -> dict:  # type: ignore[type-arg]
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)  # type: ignore[no-any-return]


def test_nan_scores_are_refused_not_ranked_first() -> None:
    retrieval = torch.tensor([[3.0, 2.0, 1.0]], dtype=torch.float64)
    target = torch.tensor([1])
    assert served_order_ranks(torch.tensor([[0.5, 0.2, 0.1]], dtype=torch.float64), retrieval, target).tolist() == [2]
    for scores in ([[math.nan] * 3], [[0.5, math.nan, 0.1]], [[math.nan, 0.2, -math.inf]]):
        with pytest.raises(UnrankableScores, match="scores contain NaN"):
            served_order_ranks(torch.tensor(scores, dtype=torch.float64), retrieval, target)


def test_a_diverged_mlp_ranker_is_refused_and_auto_chooses_the_other(bundle: Path, prepared: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    work = tmp_path / "bundle"
    shutil.copytree(bundle, work)
    train_ranker = ["train-ranker", "--artifact", str(work), "--data", str(prepared), *DIRECT]
    capsys.readouterr()
    assert main([*train_ranker, "--kind", "mlp", "--lr", "1e8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error: the MLP ranker diverged (")
    assert err[0].endswith("at epoch 1); lower --lr (now 1e+08)")
    assert not (work / "ranker").exists()
    for lr in ("inf", "nan"):
        assert main([*train_ranker, "--kind", "mlp", "--lr", lr]) == 1
        assert capsys.readouterr().err.strip() == f"seqrec: error: --lr must be >= 0 and finite, got {lr}"
    with pytest.raises(SeqrecError, match="lr must be >= 0 and finite, got inf"):
        MLPConfig(n_items=3, n_meta=1, n_year_buckets=1, dim=4, lr=math.inf)

    assert main([*train_ranker, "--kind", "auto", "--lr", "1e8"]) == 0
    summary = _strict_json(capsys.readouterr().out)
    assert summary["kind"] == "lgbm"
    selection = summary["selection"]
    assert selection["chosen"] == "lgbm"
    assert set(selection["valid_ndcg@10"]) == {"lgbm"}
    assert selection["diverged"]["mlp"].startswith("the MLP ranker diverged (")
    assert f"{selection['diverged']['mlp']}; --kind auto leaves it out" in caplog.text
    manifest = _strict_json((work / "ranker" / "manifest.json").read_text())
    assert manifest["selection"] == selection
    assert 0 <= summary["valid"]["NDCG@10"] <= 1


def test_evaluating_a_bundle_whose_ranker_scores_nan_is_one_line(bundle: Path, prepared: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """A bundle written before training refused NaN (its manifest held NDCG@10 Infinity) evaluates to an error."""
    work = tmp_path / "bundle"
    shutil.copytree(bundle, work)
    data, artifact = load_prepared(prepared), load_artifact(work)
    tables = item_tables(data, data.split())
    ranker = MLPRanker(MLPConfig(n_items=data.n_items, n_meta=tables.n_meta,
                                 n_year_buckets=int(tables.year_bucket.max()), dim=artifact.manifest.dim,
                                 hidden=(8,)))
    with torch.no_grad():
        for parameter in ranker.mlp.parameters():
            parameter.fill_(math.nan)
    write_ranker(work, ranker.eval(), tables, retriever_manifest=artifact.manifest,
                 extra={"mining": {"depth": 20, "repeats": artifact.manifest.repeats}})
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(work), "--data", str(prepared), "-q"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: {work}: the mlp ranker scores NaN, which cannot be ranked (it diverged in training); "
        "train it again"]
    assert main(["evaluate", "--artifact", str(work), "--data", str(prepared), "--stage", "retriever", "-q"]) == 0
    assert np.isfinite(_strict_json(capsys.readouterr().out)["test"]["NDCG@10"])
