import importlib.metadata
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever.artifact import ArtifactError, load_artifact, sha256_file, write_artifact
from retriever.config import config_from_dict
from retriever.index import search

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 6}}
N_ITEMS = 25


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return _write(tmp_path, CONFIG)


def _write(tmp_path: Path, raw: dict) -> Path:
    torch.manual_seed(0)
    config = config_from_dict(raw)
    model = config.build(N_ITEMS).eval()
    item_ids = np.array([f"item-{i}" for i in range(1, N_ITEMS + 1)])
    write_artifact(tmp_path / "a", model, config, item_ids, metrics={"valid": {"NDCG@10": 0.5}})
    return tmp_path / "a"


def test_save_load_gives_identical_scores(bundle: Path) -> None:
    torch.manual_seed(0)
    original = config_from_dict(CONFIG).build(N_ITEMS).eval()
    loaded = load_artifact(bundle)
    histories = torch.randint(1, N_ITEMS + 1, (4, 6))
    assert torch.equal(original.score(histories), loaded.model.score(histories))
    assert loaded.item_ids[0] == "item-1"
    assert loaded.n_items == N_ITEMS
    assert loaded.manifest.metrics["valid"]["NDCG@10"] == 0.5
    assert not list(bundle.glob(".*tmp"))


def test_the_manifest_names_the_release_and_the_checkout_that_wrote_it(bundle: Path) -> None:
    manifest = load_artifact(bundle, with_index=False).manifest
    assert manifest.seqrec_version == importlib.metadata.version("seqrec")
    head = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT, check=False).stdout.split()
    if len(head) != 2 or Path(head[0]).resolve() != ROOT:
        pytest.skip("not run from a git checkout of seqrec")
    assert manifest.git_sha == head[1]


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_index_top_k_matches_model_scores(similarity: str, tmp_path: Path) -> None:
    """The index ranks as the model scores: cosine models by cosine, dot-product models by the raw dot
    product (an index of unit vectors ranked a dot model by cosine)."""
    raw = {"model": {**CONFIG["model"], "similarity": similarity, "temperature": 1.0 if similarity == "dot" else 0.05}}
    artifact = load_artifact(_write(tmp_path, raw))
    histories = torch.randint(1, N_ITEMS + 1, (5, 6))
    with torch.inference_mode():
        dense = artifact.model.score(histories)[:, 1:]
        queries = artifact.model.user_vectors(histories).numpy()
    _, rows = search(artifact.index, queries, 10)
    assert np.array_equal(rows, dense.argsort(dim=1, descending=True, stable=True)[:, :10].numpy())


def test_equal_weights_written_by_two_processes_have_equal_digests(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights' digest (and so the bundle version) names the weights, not the process that wrote them:
    torch.save given a path names the archive's inner folder after the temp file, which holds the pid."""
    first = _write(tmp_path / "one", CONFIG)
    monkeypatch.setattr("os.getpid", lambda: 4242)
    second = _write(tmp_path / "two", CONFIG)
    assert sha256_file(first / "retriever.pt") == sha256_file(second / "retriever.pt")
    versions = [json.loads((b / "manifest.json").read_text())["version"] for b in (first, second)]
    assert versions[0].rsplit("-", 1)[1] == versions[1].rsplit("-", 1)[1]


def test_tampered_weights_are_refused(bundle: Path) -> None:
    with (bundle / "retriever.pt").open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ArtifactError, match=r"retriever\.pt: checksum does not match"):
        load_artifact(bundle)


def test_missing_file_is_refused(bundle: Path) -> None:
    (bundle / "items.faiss").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(bundle)


def test_shape_mismatch_is_refused_even_with_matching_checksums(bundle: Path) -> None:
    config = json.loads((bundle / "config.json").read_text())
    config["model"]["d_model"] = 32
    (bundle / "config.json").write_text(json.dumps(config))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["sha256"]["config.json"] = sha256_file(bundle / "config.json")
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="does not fit the config's model"):
        load_artifact(bundle)


def test_not_an_artifact(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no such artifact folder"):
        load_artifact(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match=r"manifest\.json: missing"):
        load_artifact(tmp_path / "empty")
