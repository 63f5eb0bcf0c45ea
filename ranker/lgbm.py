"""LightGBM LambdaRank ranker over the dense features (no raw ID embeddings).

Groups are users' candidate lists; early stopping uses NDCG@10 on the validation
groups. The model is saved in LightGBM's text format (never pickled).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar

import lightgbm as lgb
import numpy as np
import torch
from torch import Tensor

from common.atomic import atomic_write
from ranker.features import DENSE_FEATURES, FeatureBatch

MODEL = "lgbm.txt"
DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "lambdarank",
    "metric": "ndcg",
    "eval_at": [10],
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambdarank_truncation_level": 20,
    "verbosity": -1,
    "seed": 42,
    "deterministic": True,
    "num_threads": 1,
}


class LGBMRanker:
    kind: ClassVar[str] = "lgbm"

    def __init__(self, booster: lgb.Booster, params: dict[str, Any] | None = None,
                 extra_features: tuple[str, ...] = (), inputs_sha256: str | None = None) -> None:
        expected = len(DENSE_FEATURES) + len(extra_features)
        if booster.num_feature() != expected:
            raise ValueError(f"booster has {booster.num_feature()} features; expected {expected}")
        self.booster = booster
        self.params = dict(params or {})
        self.extra_features = tuple(extra_features)
        # digest of the training and validation matrices it was fitted on (`inputs_digest`): two fits that
        # differ with equal digests differ in LightGBM, with different ones in their inputs
        self.inputs_sha256 = inputs_sha256

    def score(self, batch: FeatureBatch) -> Tensor:
        """(B, N) scores; empty candidate slots get -inf."""
        b, n, f = batch.dense.shape
        valid = batch.valid.reshape(-1).cpu().numpy()
        # one contiguous float32 matrix of the filled slots: LightGBM widens each value to double exactly,
        # so this scores as the float64 copy did, without the copy
        rows = np.ascontiguousarray(batch.dense.reshape(b * n, f).cpu().numpy()[valid], dtype=np.float32)
        scores = np.full(b * n, -np.inf, dtype=np.float32)
        if len(rows):
            scores[valid] = self.predict(rows)
        return torch.from_numpy(scores.reshape(b, n)).to(batch.dense.device)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """(rows,) float64 scores of a (rows, F) float32 matrix: LightGBM's own predictor, one thread."""
        return np.asarray(self.booster.predict(rows, num_threads=1))

    def save(self, folder: Path) -> dict[str, Any]:
        text = self.booster.model_to_string(num_iteration=self.booster.best_iteration or None)
        atomic_write(folder / MODEL, lambda p: p.write_text(text))
        config: dict[str, Any] = {"params": self.params, "best_iteration": self.booster.best_iteration}
        if self.extra_features:  # written only when present: a ranker without extras keeps its old record
            config["extra_features"] = list(self.extra_features)
        if self.inputs_sha256:
            config["inputs_sha256"] = self.inputs_sha256
        return {"files": [MODEL], "config": config}

    @classmethod
    def load(cls, folder: Path, config: dict[str, Any]) -> LGBMRanker:
        """config: what `save` returned under "config" (the manifest keeps it)."""
        return cls(lgb.Booster(model_file=str(folder / MODEL)), config.get("params"),
                   tuple(config.get("extra_features", ())), config.get("inputs_sha256"))


def inputs_digest(*arrays: np.ndarray) -> str:
    """SHA-256 over the arrays' dtypes, shapes and bytes, in order."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def fit_lgbm(
    train_x: np.ndarray, train_y: np.ndarray, train_groups: np.ndarray,
    valid_x: np.ndarray, valid_y: np.ndarray, valid_groups: np.ndarray,
    *, params: dict[str, Any] | None = None, rounds: int = 1000, patience: int = 50,
    extra_features: tuple[str, ...] = (),
) -> tuple[LGBMRanker, list[dict[str, float]]]:
    """x: (rows, F) dense features of valid candidate slots, y: 0/1, groups: sizes in row order."""
    params = {**DEFAULT_PARAMS, **(params or {})}
    names = [*DENSE_FEATURES, *extra_features]
    train = lgb.Dataset(train_x, train_y, group=train_groups, feature_name=names, free_raw_data=False)
    valid = lgb.Dataset(valid_x, valid_y, group=valid_groups, reference=train, feature_name=names)
    record: dict[str, Any] = {}
    booster = lgb.train(
        params, train, num_boost_round=rounds, valid_sets=[valid], valid_names=["valid"],
        callbacks=[lgb.early_stopping(patience, verbose=False), lgb.record_evaluation(record)],
    )
    curve = record.get("valid", {}).get("ndcg@10", [])
    history = [{"round": i + 1, "valid_ndcg@10_in_candidates": float(v)} for i, v in enumerate(curve)]
    return LGBMRanker(booster, params, extra_features,
                      inputs_digest(train_x, train_y, train_groups, valid_x, valid_y, valid_groups)), history
