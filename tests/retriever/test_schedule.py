"""wsd (warmup-stable-decay): the decay starts at a validation plateau, ends at the floor, ends training."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from offline.data.split import leave_one_out
from retriever.config import ConfigError, config_from_dict
from retriever.model import Retriever
from retriever.train import Validate, fit, lr_at
from tests.retriever.test_train import TINY, _cycle_sequences

# Gains for 3 evaluations, then a plateau: decay_patience 3 starts the decay after epoch 6, and it
# lasts ceil(0.25 * 6) = 2 epochs, so training ends after epoch 8.
SCRIPT = [0.1, 0.2, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
WSD = {**TINY, "train": {**TINY["train"], "schedule": "wsd", "lr": 0.01, "warmup_steps": 2, "epochs": 12,
                         "patience": 10, "decay_patience": 3, "decay_fraction": 0.25, "lr_floor": 0.1}}


def _scripted(values: Sequence[float]) -> Validate:
    """A validation callback that reports ``values`` in turn (the model's real quality plays no part)."""
    queue = list(values)

    def validate(model: Retriever) -> dict[str, float]:
        return {"NDCG@10": queue.pop(0)}

    return validate


def test_lr_at_holds_until_the_decay_begins_then_falls_linearly_to_the_floor() -> None:
    config = config_from_dict(WSD)
    assert lr_at(0, 0, config) == pytest.approx(0.005)  # warmup
    assert lr_at(500, 0, config) == pytest.approx(0.01)  # stable: no horizon without a plateau
    assert lr_at(99, 0, config, (100, 10)) == pytest.approx(0.01)
    assert lr_at(100, 0, config, (100, 10)) == pytest.approx(0.01 * (0.1 + 0.9 * 0.9))
    assert lr_at(109, 0, config, (100, 10)) == pytest.approx(0.001)  # the floor, on the decay's last step
    assert lr_at(150, 0, config, (100, 10)) == pytest.approx(0.001)


def test_decay_starts_only_after_a_plateau_and_training_ends_at_the_floor(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    result = fit(config_from_dict(WSD), split.train.offsets, split.train.items, 30, _scripted(SCRIPT), tmp_path,
                 progress=False)
    lrs = [r["lr"] for r in result.history]
    assert len(lrs) == 8  # 3 gains + 3 bad evaluations, then 2 decay epochs; epochs=12 never reached
    assert lrs[:6] == pytest.approx([0.01] * 6)
    assert 0.001 < lrs[6] < 0.01
    assert lrs[7] == pytest.approx(0.001)
    assert result.best_epoch == 3
    state = torch.load(tmp_path / "last.pt", weights_only=True)["state"]
    assert state["decay_start"] == 6 * state["decay_steps"] // 2  # 2 epochs of decay began after 6 epochs


def test_without_a_plateau_wsd_keeps_the_lr_to_the_epoch_limit(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    raw = {**WSD, "train": {**WSD["train"], "epochs": 5}}
    result = fit(config_from_dict(raw), split.train.offsets, split.train.items, 30,
                 _scripted([0.1, 0.2, 0.3, 0.4, 0.5]), tmp_path, progress=False)
    assert [r["lr"] for r in result.history] == pytest.approx([0.01] * 5)


def test_resume_mid_decay_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    config = config_from_dict(WSD)
    whole = fit(config, split.train.offsets, split.train.items, 30, _scripted(SCRIPT), tmp_path / "a",
                progress=False)
    # Stop after epoch 7 (one decay epoch done), then resume with the full config.
    short = config_from_dict({**WSD, "train": {**WSD["train"], "epochs": 7}})
    fit(short, split.train.offsets, split.train.items, 30, _scripted(SCRIPT), tmp_path / "b", progress=False)
    checkpoint = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    assert checkpoint["state"]["decay_start"] is not None
    checkpoint["config"] = config.model_dump_json()
    torch.save(checkpoint, tmp_path / "b" / "last.pt")
    resumed = fit(config, split.train.offsets, split.train.items, 30, _scripted(SCRIPT[7:]), tmp_path / "b",
                  resume=True, progress=False)
    assert [r["epoch"] for r in resumed.history] == list(range(1, 9))
    assert [r["lr"] for r in resumed.history] == pytest.approx([r["lr"] for r in whole.history])
    assert np.allclose([r["loss"] for r in resumed.history], [r["loss"] for r in whole.history], rtol=1e-5)


def test_wsd_refuses_a_patience_that_ends_training_before_the_decay() -> None:
    with pytest.raises(ConfigError, match="decay_patience"):
        config_from_dict({"train": {"schedule": "wsd", "patience": 3, "decay_patience": 3}})
