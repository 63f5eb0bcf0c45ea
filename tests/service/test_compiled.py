"""The served path through ONNX Runtime (SEQREC_INFERENCE): same answers as eager, old bundles compiled at
load, and the eager fallback (or, with ``onnx``, a refusal) when the encoder does not compile; the LightGBM
ranker's trees compiled by lleaves, with LightGBM's predictor as the fallback."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from offline.cli import main as seqrec
from ranker.compiled import MLP_FILE, CompiledLGBM, CompiledMLP, check_lgbm, load_lgbm, threshold_rows
from ranker.lgbm import LGBMRanker
from retriever.artifact import write_artifact
from retriever.compiled import ENCODER_FILE, ExportRefused
from service.http.settings import Settings
from service.system.bundle import BundleError
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch
from tests.tiny import COMPILED_EAGER, MODEL_CONFIGS, TINY_ITEMS, tiny_config, tiny_retriever


@pytest.fixture(scope="module")
def mlp_bundle(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served bundle with an MLP ranker in place of LightGBM (written by the real `seqrec train-ranker`)."""
    return _with_mlp(bundle, prepared, tmp_path_factory.mktemp("compiled") / "mlp")


def _with_mlp(bundle: Path, prepared: Path, path: Path, *flags: str) -> Path:
    shutil.copytree(bundle, path)
    assert seqrec(["train-ranker", "--artifact", str(path), "--data", str(prepared), "--kind", "mlp", "--mining",
                   "direct", "--depth", "20", *flags, "--threads", "1", "-q"]) == 0
    return path


def _queries(n_items: int) -> list[Query]:
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 3, 10, 25, 7, 2, 10, 5]  # max_len is 10: shorter ones are padded, longer ones cut
    # a fixed request time and newest interaction (the synthetic data's clock), read by the request-time columns
    return [Query(torch.randint(1, n_items + 1, (n,), generator=generator).tolist()[-10:], k=10, candidates=20,
                  at=1_620_000_000.0 + 86_400 * n, last_event=1_620_000_000.0) for n in lengths]


EXTRAS = "cooc_last1,cooc_rank,popularity_trend,recent_30d,user_idle_days"


@pytest.fixture(scope="module")
def mlp_extras_bundle(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``mlp_bundle``, the MLP trained with extra feature columns after the base ones."""
    return _with_mlp(bundle, prepared, tmp_path_factory.mktemp("compiled") / "mlp-extras", "--features", EXTRAS)


def test_the_compiled_bundle_answers_as_the_eager_one(mlp_bundle: Path) -> None:
    _compiled_answers_as_eager(mlp_bundle)


def test_an_mlp_with_extra_features_compiles_and_answers_as_the_eager_one(mlp_extras_bundle: Path) -> None:
    # Its ONNX export once built its example batch with the base columns alone and failed.
    manifest = json.loads((mlp_extras_bundle / "ranker" / "manifest.json").read_text())
    assert manifest["features"]["dense"][-5:] == EXTRAS.split(",")
    _compiled_answers_as_eager(mlp_extras_bundle)


@pytest.fixture(scope="module")
def mlp_ensemble_bundle(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``mlp_bundle``, the MLP an ensemble of three networks (`seqrec train-ranker --members 3`)."""
    return _with_mlp(bundle, prepared, tmp_path_factory.mktemp("compiled") / "mlp-ensemble", "--members", "3")


def test_an_mlp_ensemble_compiles_and_answers_as_the_eager_one(mlp_ensemble_bundle: Path) -> None:
    manifest = json.loads((mlp_ensemble_bundle / "ranker" / "manifest.json").read_text())
    assert manifest["config"]["members"] == 3
    assert {h["member"] for h in manifest["training"]["history"]} == {0, 1, 2}
    _compiled_answers_as_eager(mlp_ensemble_bundle)


def _compiled_answers_as_eager(mlp_bundle: Path) -> None:
    assert (mlp_bundle / ENCODER_FILE).is_file()
    assert (mlp_bundle / "ranker" / MLP_FILE).is_file()
    compiled, eager = load_bundle(mlp_bundle), load_bundle(mlp_bundle, inference="eager")
    assert compiled.inference == {"encoder": "onnx", "ranker": "onnx"}
    assert eager.inference == {"encoder": "eager", "ranker": "eager"}
    assert eager.compiled_encoder is None
    assert compiled.ranker is not None
    assert isinstance(compiled.ranker.ranker, CompiledMLP)
    queries = _queries(compiled.n_items)
    for batch in (queries[:1], queries):  # one request alone, then all in one batch
        for got, expected in zip(recommend_batch(compiled, batch), recommend_batch(eager, batch), strict=True):
            assert [i for i, _, _ in got.items] == [i for i, _, _ in expected.items]
            for (_, score, retrieval), (_, score_e, retrieval_e) in zip(got.items, expected.items, strict=True):
                assert abs(score - score_e) <= 1e-4
                assert abs(retrieval - retrieval_e) <= 1e-4


def test_the_lightgbm_trees_compiled_answer_as_lightgbm(bundle: Path) -> None:
    compiled, eager = load_bundle(bundle), load_bundle(bundle, inference="eager")
    assert compiled.inference == {"encoder": "onnx", "ranker": "lleaves"}
    assert eager.inference == {"encoder": "eager", "ranker": "lgbm"}
    assert compiled.ranker is not None
    assert eager.ranker is not None
    assert isinstance(compiled.ranker.ranker, CompiledLGBM)
    assert type(eager.ranker.ranker) is LGBMRanker
    queries = _queries(compiled.n_items)
    for batch in (queries[:1], queries):
        for got, expected in zip(recommend_batch(compiled, batch), recommend_batch(eager, batch), strict=True):
            assert [i for i, _, _ in got.items] == [i for i, _, _ in expected.items]
            for (_, score, _), (_, score_e, _) in zip(got.items, expected.items, strict=True):
                assert abs(score - score_e) <= 1e-4  # the encoder's float32 (ONNX against eager); the trees: 1e-15
    ranker = eager.ranker.ranker
    assert isinstance(ranker, LGBMRanker)
    rows = threshold_rows(ranker.booster, 2000, seed=1)
    assert np.abs(load_lgbm(ranker).predict(rows) - ranker.predict(rows)).max() <= 1e-9


def test_a_forest_that_branches_otherwise_is_refused(bundle: Path) -> None:
    """The check compares against LightGBM at every threshold: a forest of the same trees but the first one
    (standing for a miscompiled one) is refused."""
    eager = load_bundle(bundle, inference="eager").ranker
    assert eager is not None
    assert isinstance(eager.ranker, LGBMRanker)
    booster = eager.ranker.booster
    assert booster.num_trees() > 1
    first_tree = LGBMRanker(type(booster)(model_str=booster.model_to_string(num_iteration=1)), eager.ranker.params,
                            eager.ranker.extra_features)
    with pytest.raises(ExportRefused, match="differ from LightGBM's"):
        check_lgbm(load_lgbm(first_tree), eager.ranker)


def test_without_lleaves_lightgbm_predicts(bundle: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "lleaves", None)  # `import lleaves` raises ImportError
    with caplog.at_level(logging.INFO, logger="service.system.loader"):
        loaded = load_bundle(bundle, inference="onnx")  # not a refusal: LightGBM is native code too
    assert loaded.inference == {"encoder": "onnx", "ranker": "lgbm"}
    assert loaded.ranker is not None
    assert type(loaded.ranker.ranker) is LGBMRanker
    assert [r.getMessage() for r in caplog.records if "LightGBM predicts" in r.getMessage()] == [
        f"{bundle}: LightGBM predicts for the ranker (not compiled): lleaves is not importable "
        "(import of lleaves halted; None in sys.modules)"]


def _drop_compiled(path: Path, record: dict[str, str] | None) -> None:
    """Make ``path`` look like a bundle written before the compiled path (or, with ``record``, one whose
    encoder was refused when it was written)."""
    (path / ENCODER_FILE).unlink()
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["sha256"][ENCODER_FILE]
    del manifest["compiled"]
    if record is not None:
        manifest["compiled"] = record
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_an_old_bundle_is_compiled_once_at_load(bundle: Path, tmp_path: Path) -> None:
    path = tmp_path / "old"
    shutil.copytree(bundle, path)
    _drop_compiled(path, None)
    loaded = load_bundle(path, inference="onnx")
    assert loaded.inference == {"encoder": "onnx", "ranker": "lleaves"}
    assert not (path / ENCODER_FILE).exists()  # compiled in memory: the bundle's files stay as published


def test_an_encoder_that_did_not_compile_serves_eagerly_or_is_refused_under_onnx(
        bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "eager"
    shutil.copytree(bundle, path)
    _drop_compiled(path, {"encoder": "eager", "reason": "the exporter failed: made up for this test"})
    with caplog.at_level(logging.INFO, logger="service.system.loader"):
        loaded = load_bundle(path)
    assert loaded.inference["encoder"] == "eager"
    assert loaded.compiled_encoder is None
    assert [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()] == [
        f"{path}: the encoder runs eagerly: the exporter failed: made up for this test"]
    with pytest.raises(BundleError, match="SEQREC_INFERENCE=onnx, but the encoder does not compile: the exporter"):
        load_bundle(path, inference="onnx")


def test_the_inference_setting_takes_three_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().inference == "auto"
    monkeypatch.setenv("SEQREC_INFERENCE", "eager")
    assert Settings().inference == "eager"
    monkeypatch.setenv("SEQREC_INFERENCE", "fast")
    with pytest.raises(ValidationError, match="inference"):
        Settings()


@pytest.mark.parametrize("name", sorted(COMPILED_EAGER))
def test_a_backbone_that_does_not_compile_is_served_eagerly(name: str, tmp_path: Path) -> None:
    """Written as `seqrec train` writes it (no encoder.onnx, the reason in the manifest), served eagerly."""
    config_path = next(c for c in MODEL_CONFIGS if c.stem == name)
    model = tiny_retriever(config_path)
    path = tmp_path / name
    manifest = write_artifact(path, model, tiny_config(config_path), np.array([f"i{i}" for i in range(TINY_ITEMS)]))
    assert manifest.compiled is not None
    assert manifest.compiled["encoder"] == "eager"
    assert not (path / ENCODER_FILE).exists()
    loaded = load_bundle(path)
    assert loaded.inference == {"encoder": "eager"}
    history = torch.tensor([[0, 0, 3, 9, 4, 17, 2, 8, 30, 11, 5, 1]])
    with torch.inference_mode():
        assert torch.equal(loaded.encode(history), model.user_vectors(history).float())
