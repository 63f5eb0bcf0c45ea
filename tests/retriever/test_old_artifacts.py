"""Artifacts written by an older release still load and score as they did (fixtures/README.md)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever.artifact import load_artifact

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
    assert artifact.manifest["metrics"]["valid"]["NDCG@10"] == 0.25
    assert artifact.manifest["training"]["best_epoch"] == 1
    assert artifact.manifest["backbone"] == json.loads((path / "config.json").read_text())["model"]["backbone"]
