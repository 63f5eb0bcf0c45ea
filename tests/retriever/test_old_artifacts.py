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
    np.testing.assert_array_equal(scores, np.load(path / "expected_scores.npy"))
    assert artifact.manifest.metrics["valid"]["NDCG@10"] == 0.25
    assert artifact.manifest["training"]["best_epoch"] == 1  # the dict-style read still works
    assert artifact.manifest == json.loads((path / "manifest.json").read_text())
    assert artifact.manifest["backbone"] == json.loads((path / "config.json").read_text())["model"]["backbone"]


def test_a_trained_manifest_round_trips_through_the_typed_record() -> None:
    raw = json.loads((FIXTURES / "trained_manifest.json").read_text())
    manifest = RetrieverManifest.model_validate(raw)
    assert manifest.to_dict() == raw
    assert list(manifest.to_dict()) == list(raw)  # the file's key order, so rewriting it changes nothing else
    assert manifest == raw
    assert raw == manifest  # the service compares the file it reads back with the loaded record
    assert manifest.backbone == "transformer"
    assert manifest.dim == 32
    assert manifest.metrics["test"]["NDCG@10"] == 0.645293
    assert manifest.training is not None
    assert manifest.training["epochs_run"] == 2
    assert manifest.sha256 is not None
    assert set(manifest.sha256) >= {"config.json", "retriever.pt", "item_ids.npy", "items.faiss"}


def test_dict_style_reads_keep_a_dicts_meaning() -> None:
    manifest = RetrieverManifest.model_validate({"format": "seqrec.retriever/1", "version": "v1", "n_items": 3,
                                                 "added_later": {"x": 1}})
    assert manifest["version"] == "v1"
    assert manifest["added_later"] == {"x": 1}  # unknown keys are kept
    assert manifest.get("training") is None  # a field the file does not hold is missing, as in a dict
    assert manifest.get("dim", -1) == -1
    assert "index" not in manifest
    assert "n_items" in manifest
    with pytest.raises(KeyError):
        manifest["sha256"]
    assert manifest.to_dict() == {"format": "seqrec.retriever/1", "version": "v1", "n_items": 3,
                                  "added_later": {"x": 1}}
    assert dict(manifest) == manifest.to_dict()
    assert {**manifest, "version": "v2"}["version"] == "v2"


def test_an_old_artifact_with_a_rebuilt_index_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "a"
    shutil.copytree(FIXTURES / "old_lstm_artifact", path)
    before = json.loads((path / "manifest.json").read_text())
    manifest = rewrite_index(path, IndexSpec(kind="hnsw"))
    after = json.loads((path / "manifest.json").read_text())
    assert list(after) == list(before)
    assert after["index"]["kind"] == "hnsw"
    assert manifest == after
    assert {k: v for k, v in after.items() if k not in ("index", "sha256")} == {
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
