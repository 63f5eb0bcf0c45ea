"""The served path through ONNX Runtime (SEQREC_INFERENCE): same answers as eager, old bundles compiled at
load, and the eager fallback (or, with ``onnx``, a refusal) when the encoder does not compile."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from offline.cli import main as seqrec
from ranker.compiled import MLP_FILE, CompiledMLP
from retriever.artifact import write_artifact
from retriever.compiled import ENCODER_FILE
from service.bundle import BundleError, load_bundle
from service.recommend import Query, recommend_batch
from service.settings import Settings
from tests.tiny import COMPILED_EAGER, MODEL_CONFIGS, TINY_ITEMS, tiny_config, tiny_retriever


@pytest.fixture(scope="module")
def mlp_bundle(bundle: Path, prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served bundle with an MLP ranker in place of LightGBM (written by the real `seqrec train-ranker`)."""
    path = tmp_path_factory.mktemp("compiled") / "mlp"
    shutil.copytree(bundle, path)
    assert seqrec(["train-ranker", "--artifact", str(path), "--data", str(prepared), "--kind", "mlp", "--mining",
                   "direct", "--depth", "20", "--threads", "1", "-q"]) == 0
    return path


def _queries(n_items: int) -> list[Query]:
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 3, 10, 25, 7, 2, 10, 5]  # max_len is 10: shorter ones are padded, longer ones cut
    return [Query(torch.randint(1, n_items + 1, (n,), generator=generator).tolist()[-10:], k=10, candidates=20)
            for n in lengths]


def test_the_compiled_bundle_answers_as_the_eager_one(mlp_bundle: Path) -> None:
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
    assert loaded.inference == {"encoder": "onnx", "ranker": "lgbm"}
    assert not (path / ENCODER_FILE).exists()  # compiled in memory: the bundle's files stay as published


def test_an_encoder_that_did_not_compile_serves_eagerly_or_is_refused_under_onnx(
        bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "eager"
    shutil.copytree(bundle, path)
    _drop_compiled(path, {"encoder": "eager", "reason": "the exporter failed: made up for this test"})
    with caplog.at_level(logging.INFO, logger="service.bundle"):
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
