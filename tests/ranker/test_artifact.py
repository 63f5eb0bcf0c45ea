"""The ranker manifest is typed, and a manifest written before it was still loads and writes back the same."""

import json
from pathlib import Path

import pytest

from ranker.artifact import FORMAT, RankerArtifact, RankerManifest, read_manifest
from retriever.artifact import ArtifactError

# Written by `seqrec demo` before the manifest was a model (training history cut to three rounds).
FIXTURE = Path(__file__).parent / "fixtures" / "manifest_v1.json"


def test_an_old_manifest_loads_and_writes_back_byte_for_byte() -> None:
    text = FIXTURE.read_text()
    manifest = RankerManifest.model_validate(json.loads(text))
    assert json.dumps(manifest.to_json_dict(), indent=2) == text  # same keys, same order, same values
    assert manifest.kind == "lgbm"
    assert manifest.mining is not None
    assert manifest.mining["depth"] == 100
    assert manifest.sha256.keys() == {"lgbm.txt", "item_tables.npz"}


def test_fields_are_read_by_attribute_and_unwritten_ones_stay_out_of_the_file() -> None:
    manifest = RankerManifest.model_validate(json.loads(FIXTURE.read_text()))
    assert manifest.kind == "lgbm"
    assert manifest.selection is not None
    assert manifest.selection["chosen"] == "lgbm"
    sparse = RankerManifest(format=FORMAT, kind="mlp")
    assert sparse.mining is None
    assert "mining" not in sparse.to_json_dict()  # never written: missing from the file, as in the dict it replaced
    assert list(sparse.to_json_dict()) == ["format", "kind"]
    with pytest.raises(TypeError):
        sparse["kind"]  # type: ignore[index]  # no dict look-ups: the record is read by attribute


def test_the_mined_depth_is_read_from_the_mining_record_or_refused(tmp_path: Path) -> None:
    manifest = RankerManifest.model_validate(json.loads(FIXTURE.read_text()))
    assert RankerArtifact(tmp_path, manifest, ranker=None, tables=None).depth == 100  # type: ignore[arg-type]
    sparse = RankerArtifact(tmp_path, RankerManifest(format=FORMAT, kind="mlp"), ranker=None, tables=None)  # type: ignore[arg-type]
    with pytest.raises(ArtifactError, match=r"manifest\.json: records no mining depth"):
        sparse.depth  # noqa: B018


def test_a_manifest_of_the_wrong_shape_is_one_artifact_error(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "features": ["not", "a", "dict"]}))
    with pytest.raises(ArtifactError, match="features"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something/else"}))
    with pytest.raises(ArtifactError, match=f"not a {FORMAT} manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(ArtifactError, match="unreadable"):
        read_manifest(tmp_path)
