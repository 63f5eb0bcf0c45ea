"""Retriever settings sized from the data's shape and the device, for a pipeline config that names none.

Every rule is a function of the statistics in `DataShape` and of the `Device`, never of a dataset's name; each
returns a value and the reason it is printed and stored with. `sized_settings` applies them in one pass and
returns ``{"section.key": Sized}``; the caller (offline/jobs/sizing.py) keeps only the keys a config leaves unset.
The thresholds are documented with their validation evidence in docs/own-data.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# Full softmax scores every item at every training position: an epoch costs interactions x items logits. Above
# this many, the in-batch softmax with logQ (the cost of a batch's distinct targets) replaces it.
FULL_SOFTMAX_LOGITS = {"cpu": 3e9, "cuda": 1e11}
MAX_LEN_CAP = {"cpu": 100, "cuda": 200}  # attention costs O(max_len) per position: shorter windows on a CPU
ATTENTION_BUDGET = {"cpu": 3e7, "cuda": 1e9}  # interactions x max_len per epoch: long windows only on small data
MIN_EPOCHS = 20
MIN_STEPS = 50  # optimiser steps an epoch
MAX_EPOCHS = 200


@dataclass(frozen=True)
class DataShape:
    """The statistics the rules read: training sequences after the leave-one-out split."""

    interactions: int
    users: int
    items: int
    mean_length: float  # training items per user
    length_quantiles: dict[str, float]  # "q50", "q90", "q95" of the training lengths
    feature_columns: dict[str, int] = field(default_factory=dict)  # list-valued catalogue column -> distinct values

    @property
    def density(self) -> float:
        return self.interactions / max(1, self.users * self.items)

    @property
    def per_item(self) -> float:
        """Training interactions per catalogue item: how much evidence each item embedding gets."""
        return self.interactions / max(1, self.items)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "density": round(self.density, 6), "per_item": round(self.per_item, 2)}


@dataclass(frozen=True)
class Device:
    kind: Literal["cpu", "cuda"]
    threads: int

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "threads": self.threads, "precision": "bf16" if self.kind == "cuda" else "fp32"}


@dataclass(frozen=True)
class Sized:
    value: Any
    rule: str


def max_len(shape: DataShape, device: Device) -> Sized:
    """The 95th percentile of training lengths, rounded up to a multiple of 10, in [20, cap]: the cap is the
    device's, lowered so that interactions x max_len stays in the device's attention budget."""
    q95 = shape.length_quantiles["q95"]
    by_cost = 10 * int(ATTENTION_BUDGET[device.kind] / max(1, shape.interactions) / 10)
    cap = max(20, min(MAX_LEN_CAP[device.kind], by_cost))
    value = int(min(cap, max(20, 10 * math.ceil(q95 / 10))))
    return Sized(value, f"q95 of training lengths {q95:.0f} -> multiple of 10 in [20, {cap}] "
                        f"({shape.interactions} interactions x max_len <= {ATTENTION_BUDGET[device.kind]:.0e})")


def d_model(shape: DataShape, device: Device) -> Sized:
    """64 on a CPU until 2M interactions, then 128; a GPU doubles it (bf16 makes the width cheap)."""
    base = 64 if shape.interactions < 2_000_000 else 128
    value = base * (2 if device.kind == "cuda" and shape.interactions >= 200_000 else 1)
    return Sized(value, f"{shape.interactions} interactions on {device.kind}")


def n_layers(shape: DataShape, device: Device) -> Sized:
    value = 4 if device.kind == "cuda" and shape.interactions >= 1_000_000 else 2
    return Sized(value, f"{shape.interactions} interactions on {device.kind}")


def n_heads(width: int) -> Sized:
    return Sized(max(1, width // 32), f"head width 32 over d_model {width}")


def dropout(shape: DataShape) -> Sized:
    """0.5 at <= 16 training interactions per item, 0.1 at >= 128, linear in log2 between: sparse catalogues
    (few examples per embedding row) need the heavy dropout, dense ones little."""
    steps = (math.log2(max(1.0, shape.per_item)) - 4) / 3
    value = round(min(0.5, max(0.1, 0.5 - 0.4 * steps)), 2)
    return Sized(value, f"{shape.per_item:.1f} training interactions per item")


def loss(shape: DataShape, device: Device) -> dict[str, Sized]:
    limit, logits = FULL_SOFTMAX_LOGITS[device.kind], float(shape.interactions) * shape.items
    size = f"{shape.interactions} interactions x {shape.items} items = {logits:.1e} logits an epoch"
    if logits <= limit:
        return {"loss.name": Sized("full", f"{size} <= {limit:.0e}: full softmax")}
    why = f"{size} > {limit:.0e}: in-batch softmax with logQ and uniform negatives"
    return {"loss.name": Sized("infonce", why), "loss.logq": Sized(True, why), "loss.n_uniform": Sized(256, why)}


def batch_size(shape: DataShape, device: Device, window: int) -> tuple[int, str]:
    """The largest power of two up to the device's (128 CPU, 256 GPU), at least 32, that leaves an epoch of the
    training windows (about users + interactions / max_len) MIN_STEPS optimiser steps: small data gets small
    batches rather than a dozen steps an epoch."""
    windows = shape.users + shape.interactions / window
    batch = largest = 256 if device.kind == "cuda" else 128
    while batch > 32 and windows / batch < MIN_STEPS:
        batch //= 2
    return batch, f"about {windows:.0f} training windows: >= {MIN_STEPS} steps an epoch, in [32, {largest}]"


def schedule(shape: DataShape, device: Device, window: int) -> dict[str, Sized]:
    """wsd: the lr decays once validation plateaus and training ends with the decay (or by patience); the epoch
    cap shrinks as sqrt(interactions), so a run without a budget takes time about proportional to the data."""
    epochs = int(min(MAX_EPOCHS, max(MIN_EPOCHS, round(MAX_EPOCHS * math.sqrt(100_000 / max(1, shape.interactions))))))
    batch, why = batch_size(shape, device, window)
    return {
        "train.schedule": Sized("wsd", "decay on a validation plateau, stop after it"),
        "train.decay_patience": Sized(3, "validations without a gain before the decay"),
        "train.patience": Sized(6, "validations without a gain before stopping (> decay_patience)"),
        "train.epochs": Sized(epochs, f"cap {MAX_EPOCHS} * sqrt(1e5 / {shape.interactions} interactions) "
                              f"in [{MIN_EPOCHS}, {MAX_EPOCHS}]"),
        "train.warmup_steps": Sized(50, "short warmup"),
        "train.batch_size": Sized(batch, why),
        "train.lr": Sized(0.001 * math.sqrt(max(1, batch / 128)), "1e-3 up to 128 sequences, sqrt-scaled above"),
    }


def item_features(shape: DataShape) -> dict[str, Sized]:
    """The catalogue's richest list-valued column (genres, attributes...) when it has one."""
    if not shape.feature_columns:
        return {}
    column = max(sorted(shape.feature_columns), key=lambda c: shape.feature_columns[c])
    return {"model.item_features": Sized(column, f"list-valued catalogue column with "
                                                 f"{shape.feature_columns[column]} distinct values")}


def sized_settings(shape: DataShape, device: Device) -> dict[str, Sized]:
    """Every sized key, dotted as a pipeline config's ``overrides:`` names it."""
    width, window = d_model(shape, device), max_len(shape, device)
    drop = dropout(shape)
    return {
        "model.backbone": Sized("transformer", "the default backbone"),
        "model.max_len": window,
        "model.d_model": width,
        "model.n_layers": n_layers(shape, device),
        "model.n_heads": n_heads(width.value),
        "model.dropout": drop,
        "model.emb_dropout": Sized(drop.value, "as model.dropout"),
        **item_features(shape),
        **loss(shape, device),
        **schedule(shape, device, window.value),
    }


def shrunk(values: dict[str, Any], fixed: set[str]) -> dict[str, Any] | None:
    """One step smaller (half the window, half the width, one layer) on the keys not in ``fixed``; None when
    nothing can shrink further. The budget planner's second lever, after the epochs."""
    out = dict(values)
    steps = {"model.max_len": lambda v: max(10, v // 2), "model.d_model": lambda v: max(32, v // 2),
             "model.n_layers": lambda v: max(1, v - 1)}
    for key, smaller in steps.items():
        if key in fixed or key not in values:
            continue
        out[key] = smaller(values[key])
    if "model.d_model" in out and "model.n_heads" not in fixed:
        out["model.n_heads"] = max(1, int(out["model.d_model"]) // 32)
    return None if out == values else out
