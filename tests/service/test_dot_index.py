"""A dot-product retriever is served by the dot product: the FAISS index and the exact scan behind business
filters hold its raw scoring vectors (both held unit vectors before, so a dot model was served by cosine)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever.artifact import item_matrix, load_artifact, sha256_file, write_artifact
from retriever.config import config_from_dict
from retriever.index import IndexSpec, build_index, normalize, save_index
from retriever.model import Retriever
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch

N_ITEMS = 40


def _dot_bundle(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = config_from_dict({"model": {"backbone": "sasrec", "d_model": 16, "n_layers": 1, "n_heads": 2,
                                         "max_len": 8, "similarity": "dot", "temperature": 1.0}})
    model = config.build(N_ITEMS).eval()
    with torch.no_grad():  # item vectors of very different lengths, so cosine and dot rank differently
        model.encoder.item_emb.weight.mul_(torch.linspace(0.2, 5.0, N_ITEMS + 1)[:, None])
    write_artifact(tmp_path / "dot", model, config, np.array([f"i{i}" for i in range(1, N_ITEMS + 1)]))
    return tmp_path / "dot"


def _dense_top(bundle_model: Retriever, history: list[int], allowed: np.ndarray | None, k: int) -> list[int]:
    with torch.no_grad():
        scores = bundle_model.score(torch.tensor([history]))[0, 1:]
    scores[torch.tensor(history) - 1] = -torch.inf
    if allowed is not None:
        scores[~torch.from_numpy(allowed)] = -torch.inf
    return (scores.argsort(descending=True, stable=True)[:k] + 1).tolist()


def test_served_lists_follow_the_dot_product_with_and_without_filters(tmp_path: Path) -> None:
    bundle = load_bundle(_dot_bundle(tmp_path), inference="eager")
    model = bundle.artifact.model
    allowed = np.zeros(N_ITEMS, dtype=bool)
    allowed[::3] = True
    rng = np.random.default_rng(0)
    differs = 0
    for _ in range(8):
        history = [int(i) for i in rng.choice(np.arange(1, N_ITEMS + 1), size=5, replace=False)]
        for mask in (None, allowed):
            result = recommend_batch(bundle, [Query(history=history, k=5, candidates=20, allowed=mask)])[0]
            assert [item for item, _, _ in result.items] == _dense_top(model, history, mask, 5)
        with torch.no_grad():
            user = torch.nn.functional.normalize(model.user_vectors(torch.tensor([history])), dim=-1)[0]
            cosine = (torch.nn.functional.normalize(model.item_vectors()[1:], dim=-1) @ user).clone()
        cosine[torch.tensor(history) - 1] = -torch.inf
        differs += (cosine.argsort(descending=True)[:5] + 1).tolist() != _dense_top(model, history, None, 5)
    assert differs  # the check can tell the two apart on this model


def test_a_dot_model_with_an_index_of_unit_vectors_is_named_at_load(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A bundle written before the fix (its index built from unit vectors) still loads, with a warning that
    names the command that rebuilds the index."""
    path = _dot_bundle(tmp_path)
    artifact = load_artifact(path)
    save_index(build_index(normalize(item_matrix(artifact.model)), IndexSpec()), path / "items.faiss")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["sha256"]["items.faiss"] = sha256_file(path / "items.faiss")
    (path / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="service.system.loader"):
        load_bundle(path, inference="eager")
    assert "seqrec export --artifact" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="service.system.loader"):
        load_bundle(_dot_bundle(tmp_path / "fresh"), inference="eager")
    assert "unit vectors" not in caplog.text


def test_a_second_sources_candidates_get_the_score_faiss_gives_the_rest(tmp_path: Path) -> None:
    """`ranker.cooc.union` scores the items the co-occurrence source adds with the retrieval rows: for a dot
    model the unit user times the raw item vector, FAISS's own scale (they were scored by cosine, so one list
    and one feature held two scales); the service and the offline jobs read the same rows."""
    from ranker.artifact import unit_item_vectors
    from ranker.cooc import union
    from retriever.artifact import retrieval_rows
    from retriever.index import search

    bundle = load_bundle(_dot_bundle(tmp_path), inference="eager")
    model = bundle.artifact.model
    offline = retrieval_rows(model, unit_item_vectors(model.item_vectors().detach()))
    assert np.array_equal(bundle.retrieval_rows, offline)
    assert not np.allclose(offline[1:], normalize(offline[1:]))  # raw rows: lengths differ
    with torch.no_grad():
        user = torch.nn.functional.normalize(model.user_vectors(torch.tensor([[3, 9, 27]])), dim=-1).numpy()
    assert bundle.artifact.index is not None
    scores, rows = search(bundle.artifact.index, user, 6)
    retrieved = rows + 1
    others = np.array([[i for i in range(1, N_ITEMS + 1) if i not in retrieved[0]][:6]])
    merged, merged_scores = union(retrieved, scores, others, user, bundle.retrieval_rows, np.array([6]), 0.5)
    added = ~np.isin(merged[0], retrieved[0])
    assert added.sum() == 3
    expected = (offline[merged[0]].astype(np.float64) @ user[0].astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(merged_scores[0], expected, atol=1e-5)
    assert (np.diff(merged_scores[0]) <= 0).all()  # one scale, so one order
