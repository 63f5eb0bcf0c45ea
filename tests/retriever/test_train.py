from pathlib import Path

import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.evaluation.evaluate import evaluate_splits
from retriever.config import ConfigError, config_from_dict
from retriever.model import Retriever
from retriever.train import fit, lr_at

TINY = {
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_len": 8, "dropout": 0.0, "emb_dropout": 0.0},
    "loss": {"name": "infonce"},
    "train": {"batch_size": 32, "lr": 0.01, "warmup_steps": 5, "epochs": 30, "patience": 30, "seed": 0,
              "threads": 1},
}


def _cycle_sequences(n_users: int = 200, n_items: int = 30, length: int = 10, seed: int = 0) -> Sequences:
    """Every user walks the cycle 1 -> 2 -> ... -> n_items -> 1 from a random start: the next item is certain."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n_items, n_users)
    rows = [[(s + t) % n_items + 1 for t in range(length)] for s in starts]
    return Sequences.from_lists(rows)


def test_lr_schedule_warms_up_then_decays() -> None:
    config = config_from_dict({"train": {"lr": 1.0, "warmup_steps": 10, "schedule": "cosine"}})
    assert lr_at(0, 110, config) == pytest.approx(0.1)
    assert lr_at(9, 110, config) == pytest.approx(1.0)
    assert lr_at(60, 110, config) == pytest.approx(0.5)
    assert lr_at(110, 110, config) == pytest.approx(0.0, abs=1e-9)


def _validate_fn(split, n_items: int):  # type: ignore[no-untyped-def]
    def validate(model: Retriever) -> dict[str, float]:
        return evaluate_splits(model.score, split, n_items, splits=("valid",), max_len=8)["valid"]

    return validate


def test_tiny_deterministic_dataset_is_learned_to_hr10_of_one(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences())
    config = config_from_dict(TINY)
    result = fit(config, split.train.offsets, split.train.items, 30, _validate_fn(split, 30), tmp_path,
                 progress=False)
    metrics = evaluate_splits(result.model.score, split, 30, max_len=8)
    assert metrics["valid"]["HR@10"] == 1.0
    assert metrics["test"]["HR@10"] == 1.0
    assert metrics["test"]["NDCG@10"] > 0.9


def test_same_seed_same_result_and_resume_continues(tmp_path: Path) -> None:
    split = leave_one_out(_cycle_sequences(n_users=60))
    raw = {**TINY, "train": {**TINY["train"], "epochs": 4, "patience": 10}}
    config = config_from_dict(raw)
    validate = _validate_fn(split, 30)
    a = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "a", progress=False)
    b = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "b", progress=False)
    assert [r["loss"] for r in a.history] == [r["loss"] for r in b.history]

    # Stop after 2 epochs, then resume to 4: the same losses as the uninterrupted run.
    short = config_from_dict({**raw, "train": {**raw["train"], "epochs": 2}})
    fit(short, split.train.offsets, split.train.items, 30, validate, tmp_path / "c", progress=False)
    checkpoint = torch.load(tmp_path / "c" / "last.pt", weights_only=True)
    assert checkpoint["state"]["epoch"] == 2
    # The resumed run must use the same config as the one it continues; patch the stored one in place.
    checkpoint["config"] = config.model_dump_json()
    torch.save(checkpoint, tmp_path / "c" / "last.pt")
    c = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "c", resume=True,
            progress=False)
    assert [r["epoch"] for r in c.history] == [1, 2, 3, 4]
    assert np.allclose([r["loss"] for r in c.history], [r["loss"] for r in a.history], rtol=1e-5)


def test_resume_accepts_a_checkpoint_from_before_a_config_key_was_added(tmp_path: Path) -> None:
    """A checkpoint whose stored config lacks a key added since (here train.eval_users) resumes: the key
    counts with its default. A real difference is still refused."""
    import json

    split = leave_one_out(_cycle_sequences(n_users=60))
    raw = {**TINY, "train": {**TINY["train"], "epochs": 2, "patience": 10}}
    config = config_from_dict(raw)
    validate = _validate_fn(split, 30)
    fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path / "r", progress=False)
    checkpoint = torch.load(tmp_path / "r" / "last.pt", weights_only=True)
    stored = json.loads(checkpoint["config"])
    del stored["train"]["eval_users"]  # as written before the key existed
    stored["train"]["epochs"] = 3  # the run is continued to a third epoch
    longer = config_from_dict({**raw, "train": {**raw["train"], "epochs": 3}})
    checkpoint["config"] = json.dumps(stored)
    torch.save(checkpoint, tmp_path / "r" / "last.pt")
    resumed = fit(longer, split.train.offsets, split.train.items, 30, validate, tmp_path / "r", resume=True,
                  progress=False)
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
    other = config_from_dict({**raw, "train": {**raw["train"], "epochs": 3, "lr": 0.5}})
    with pytest.raises(ConfigError, match="different config"):
        fit(other, split.train.offsets, split.train.items, 30, validate, tmp_path / "r", resume=True,
            progress=False)


def test_a_second_process_cannot_train_into_the_same_folder(tmp_path: Path) -> None:
    import fcntl

    from retriever.config import ConfigError

    split = leave_one_out(_cycle_sequences(n_users=20))
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held as another process would hold it
        with pytest.raises(ConfigError, match="in use by another training process"):
            fit(config_from_dict(TINY), split.train.offsets, split.train.items, 30, _validate_fn(split, 30),
                tmp_path, progress=False)
