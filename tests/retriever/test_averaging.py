"""train.ema_epochs: validation, early stopping and best.pt read the weights' moving average; it resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from offline.data.split import leave_one_out
from retriever.averaging import ema_decay
from retriever.config import ConfigError, config_from_dict
from retriever.model import Retriever
from retriever.train import fit
from tests.retriever.test_train import TINY, _cycle_sequences, _validate_fn

EMA = {**TINY, "train": {**TINY["train"], "epochs": 4, "patience": 10, "ema_epochs": 1.0}}


def test_the_decay_spans_the_horizon_in_epochs_whatever_the_steps_per_epoch() -> None:
    assert ema_decay(1.0, 1000) == pytest.approx(0.999)
    assert ema_decay(2.0, 10) == pytest.approx(0.95)
    assert ema_decay(0.5, 1) == 0.0  # under one step: no averaging, the weights as trained


def test_validation_and_best_pt_read_the_average_not_the_last_step(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    seen: list[dict[str, torch.Tensor]] = []
    validate = _validate_fn(split, 30)

    def recording(model: Retriever) -> dict[str, float]:
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return validate(model)

    result = fit(config_from_dict(EMA), split.train.offsets, split.train.items, 30, recording, tmp_path,
                 progress=False)
    checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    trained = checkpoint["model"]
    averaged = {k.removeprefix("module."): v for k, v in checkpoint["averaged"].items() if k.startswith("module.")}
    assert int(checkpoint["averaged"]["n_averaged"]) == result.history[-1]["step"]
    assert averaged.keys() == trained.keys()
    name = "encoder.item_emb.weight" if "encoder.item_emb.weight" in trained else next(iter(trained))
    assert not torch.allclose(averaged[name], trained[name])  # an average, not a copy of the last step
    assert all(torch.equal(seen[-1][k], averaged[k]) for k in averaged)  # the last validation read the average
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert all(torch.equal(best[k], seen[result.best_epoch - 1][k]) for k in best)


def test_without_ema_the_checkpoint_holds_no_average(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    raw = {**EMA, "train": {**EMA["train"], "epochs": 1, "ema_epochs": None}}
    fit(config_from_dict(raw), split.train.offsets, split.train.items, 30, _validate_fn(split, 30), tmp_path,
        progress=False)
    assert "averaged" not in torch.load(tmp_path / "last.pt", weights_only=True)


def test_resume_continues_the_average(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    config = config_from_dict(EMA)
    validate = _validate_fn(split, 30)
    whole = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "a", progress=False)
    short = config_from_dict({**EMA, "train": {**EMA["train"], "epochs": 2}})
    fit(short, split.train.offsets, split.train.items, 30, validate, tmp_path / "b", progress=False)
    checkpoint = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    checkpoint["config"] = config.model_dump_json()
    torch.save(checkpoint, tmp_path / "b" / "last.pt")
    resumed = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "b", resume=True,
                  progress=False)
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3, 4]
    assert np.allclose([r["valid"]["NDCG@10"] for r in resumed.history],
                       [r["valid"]["NDCG@10"] for r in whole.history], atol=1e-6)
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["averaged"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["averaged"]
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-5) for k in a)


def test_a_non_positive_horizon_is_refused() -> None:
    with pytest.raises(ConfigError, match="ema_epochs"):
        config_from_dict({"train": {"ema_epochs": 0}})


def test_the_average_leaves_training_as_it_was(tmp_path: Path) -> None:
    """Only what validation reads changes: the losses, step by step, are those of the run without it."""
    split = leave_one_out(_cycle_sequences(n_users=60))
    validate = _validate_fn(split, 30)
    with_ema = fit(config_from_dict(EMA), split.train.offsets, split.train.items, 30, validate, tmp_path / "a",
                   progress=False)
    raw = {**EMA, "train": {**EMA["train"], "ema_epochs": None}}
    without = fit(config_from_dict(raw), split.train.offsets, split.train.items, 30, validate, tmp_path / "b",
                  progress=False)
    assert [r["loss"] for r in with_ema.history] == [r["loss"] for r in without.history]
    assert [r["valid"]["NDCG@10"] for r in with_ema.history] != [r["valid"]["NDCG@10"] for r in without.history]
