"""Artifacts written by an older release still load and score as they did (fixtures/README.md)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever.artifact import ArtifactError, RetrieverManifest, load_artifact, rewrite_index
from retriever.index import IndexSpec

FIXTURES = Path(__file__).parent / "fixtures"
HISTORIES = torch.tensor([[0, 0, 1, 2, 3], [4, 5, 6, 7, 8], [0, 0, 0, 0, 12]])


@pytest.mark.parametrize("name", ["old_transformer_artifact", "old_lstm_artifact", "old_gru4rec_artifact"])
def test_old_artifact_loads_and_scores_as_written(name: str) -> None:
    path = FIXTURES / name
    artifact = load_artifact(path)
    assert artifact.n_items == 12
    assert artifact.item_ids[0] == "item-1"
    assert artifact.index is not None
    assert artifact.index.ntotal == 12
    with torch.no_grad():
        scores = artifact.model.score(HISTORIES)[:, 1:].numpy()
    # Within float32 rounding, not bit for bit: torch picks its CPU kernels by instruction set, and on an Intel
    # Xeon with AVX-512 these scores differ from the fixtures' (written on another CPU) by up to 2e-6 (1e-5
    # relative). Other weights, another architecture or another scale would miss by orders of magnitude more.
    np.testing.assert_allclose(scores, np.load(path / "expected_scores.npy"), rtol=1e-4, atol=1e-5)
    assert artifact.manifest.metrics["valid"]["NDCG@10"] == 0.25
    assert artifact.manifest.training is not None
    assert artifact.manifest.training["best_epoch"] == 1
    assert artifact.manifest.to_dict() == json.loads((path / "manifest.json").read_text())
    assert artifact.manifest.backbone == json.loads((path / "config.json").read_text())["model"]["backbone"]
    # Written before the repeat policy: the history stays excluded, as it always was.
    assert artifact.manifest.repeats == "exclude"
    assert artifact.manifest.exclude_seen


def test_a_trained_manifest_round_trips_through_the_typed_record() -> None:
    raw = json.loads((FIXTURES / "trained_manifest.json").read_text())
    manifest = RetrieverManifest.model_validate(raw)
    assert manifest.to_dict() == raw
    assert list(manifest.to_dict()) == list(raw)  # the file's key order, so rewriting it changes nothing else
    assert raw == manifest.to_dict()  # the service compares the file it reads back with the loaded record
    assert manifest.backbone == "transformer"
    assert manifest.dim == 32
    assert manifest.metrics["test"]["NDCG@10"] == 0.645293
    assert manifest.training is not None
    assert manifest.training["epochs_run"] == 2
    assert manifest.sha256 is not None
    assert set(manifest.sha256) >= {"config.json", "retriever.pt", "item_ids.npy", "items.faiss"}


REQUIRED = {"format": "seqrec.retriever/1", "version": "v1", "backbone": "gru4rec", "dim": 8, "n_items": 3,
            "max_len": 5}


def test_the_typed_record_keeps_unknown_keys_and_writes_only_what_the_file_held() -> None:
    manifest = RetrieverManifest.model_validate({**REQUIRED, "added_later": {"x": 1}})
    assert manifest.version == "v1"
    assert manifest.model_extra == {"added_later": {"x": 1}}  # unknown keys are kept
    assert manifest.training is None  # a field the file does not hold reads as its default ...
    assert manifest.index == {}
    assert manifest.sha256 is None
    assert manifest.to_dict() == {**REQUIRED, "added_later": {"x": 1}}  # ... and is not written back
    with pytest.raises(TypeError):
        manifest["version"]  # type: ignore[index]  # no dict look-ups: the record is read by attribute
    updated = manifest.model_copy(update={"version": "v2"})
    assert updated.version == "v2"
    assert updated.to_dict() == {**REQUIRED, "version": "v2", "added_later": {"x": 1}}
    assert list(updated.to_dict()) == list(manifest.to_dict())  # an update keeps the file's key order


@pytest.mark.parametrize("field", ["version", "backbone", "dim", "n_items", "max_len"])
def test_a_manifest_without_a_field_every_writer_wrote_is_refused_by_name(field: str, tmp_path: Path) -> None:
    path = tmp_path / "a"
    shutil.copytree(FIXTURES / "old_transformer_artifact", path)
    raw = json.loads((path / "manifest.json").read_text())
    del raw[field]
    (path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=rf"manifest\.json: unusable: {field}: Field required"):
        load_artifact(path)


def test_an_old_artifact_with_a_rebuilt_index_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "a"
    shutil.copytree(FIXTURES / "old_lstm_artifact", path)
    before = json.loads((path / "manifest.json").read_text())
    manifest = rewrite_index(path, IndexSpec(kind="hnsw"))
    after = json.loads((path / "manifest.json").read_text())
    assert list(after) == [*before, "compiled"]  # `seqrec export` compiles the encoder of an old artifact too
    assert after["index"]["kind"] == "hnsw"
    assert after["compiled"]["encoder"] == "onnx"
    assert "encoder.onnx" in after["sha256"]
    assert manifest.to_dict() == after
    assert {k: v for k, v in after.items() if k not in ("index", "sha256", "compiled")} == {
        k: v for k, v in before.items() if k not in ("index", "sha256")}
    assert load_artifact(path).manifest.index["kind"] == "hnsw"


def test_a_manifest_with_a_wrong_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a"
    shutil.copytree(FIXTURES / "old_transformer_artifact", path)
    raw = json.loads((path / "manifest.json").read_text())
    raw["dim"] = "wide"
    (path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=r"manifest\.json: unusable: dim: "):
        load_artifact(path)
