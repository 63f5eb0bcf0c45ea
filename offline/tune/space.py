"""The declared search space of `seqrec tune`, per backbone family, in one place.

Every trial starts from the base config (the user's YAML with its overrides) and replaces the keys
below. A key is searched only where the backbone has it: the attention family (any backbone with
``n_heads``: transformer, sasrec, hstu, lightsans, bert4rec, trm4rec, pcrec, bsarec) adds the head
count; the recurrent family (gru4rec, lstm, xlstm) has none. BSARec adds its filter's weight against
attention (``alpha``) and its low-frequency cut (``c``); its attention dropout follows ``dropout``.
The choices of ``max_len`` follow the data (no window much longer than the 99th-percentile training
sequence), and item features are searched on/off only when the base config names a feature column.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from retriever.backbones import BACKBONES

LENGTHS = (20, 50, 100, 200)
D_MODELS = (32, 64, 128)
HEADS = (1, 2, 4)
BATCH_SIZES = (64, 128, 256)
SCHEDULES = ("constant", "cosine", "wsd")
# name -> loss section: the full softmax, uniform sampled softmax, in-batch InfoNCE, the same with the
# logQ popularity correction, and logQ-corrected in-batch negatives mixed with uniform ones.
LOSSES: dict[str, dict[str, Any]] = {
    "full": {"name": "full"},
    "sampled": {"name": "sampled"},
    "infonce": {"name": "infonce"},
    "infonce-logq": {"name": "infonce", "logq": True},
    "infonce-mixed": {"name": "infonce", "logq": True, "n_uniform": 256},
}
LR_RANGE = (3e-4, 3e-3)
DROPOUT_RANGE = (0.1, 0.6)
NO_FEATURES = "none"
ALPHA_RANGE = (0.1, 0.9)
CUTS = (1, 3, 5, 7, 9)
PARAMS = ("d_model", "n_layers", "n_heads", "dropout", "max_len", "item_features", "loss", "lr", "batch_size",
          "schedule", "alpha", "c")  # every name `suggest` draws (what --fix may pin)


class Trial(Protocol):
    """The part of ``optuna.Trial`` the space uses (a fixed-answer stub in tests)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...


@dataclass(frozen=True)
class DataShape:
    """What the space needs to know of the data: which ``max_len`` values are worth a trial."""

    max_lens: tuple[int, ...]

    @classmethod
    def from_lengths(cls, lengths: np.ndarray) -> DataShape:
        longest = float(np.percentile(lengths, 99)) if len(lengths) else 0.0
        return cls(tuple(n for n in LENGTHS if n <= max(50.0, longest)))


def family(backbone: str) -> str:
    """attention (the backbone has heads) or recurrent."""
    return "attention" if "n_heads" in backbone_keys(backbone) else "recurrent"


def backbone_keys(backbone: str) -> set[str]:
    return {f.name for f in dataclasses.fields(BACKBONES[backbone][0])}


def suggest(trial: Trial, base: dict[str, Any], shape: DataShape) -> dict[str, Any]:
    """A trial's config: ``base`` (a raw run config) with the searched keys replaced."""
    raw = copy.deepcopy(base)
    model, train = raw.setdefault("model", {}), raw.setdefault("train", {})
    keys = backbone_keys(model.get("backbone", "transformer"))
    model["d_model"] = trial.suggest_categorical("d_model", D_MODELS)
    if "n_layers" in keys:
        model["n_layers"] = trial.suggest_int("n_layers", 1, 3)
    if "n_heads" in keys:
        model["n_heads"] = trial.suggest_categorical("n_heads", HEADS)
    model["dropout"] = trial.suggest_float("dropout", *DROPOUT_RANGE)
    for tied in ("emb_dropout", "attn_dropout"):
        if tied in keys:
            model[tied] = model["dropout"]
    if "alpha" in keys:
        model["alpha"] = trial.suggest_float("alpha", *ALPHA_RANGE)
    if "c" in keys:
        model["c"] = trial.suggest_categorical("c", CUTS)
    if "max_len" in keys:
        model["max_len"] = trial.suggest_categorical("max_len", shape.max_lens)
    if model.get("item_features"):
        use = trial.suggest_categorical("item_features", (model["item_features"], NO_FEATURES))
        model["item_features"] = None if use == NO_FEATURES else use
    raw["loss"] = dict(LOSSES[trial.suggest_categorical("loss", tuple(LOSSES))])
    train["lr"] = trial.suggest_float("lr", *LR_RANGE, log=True)
    train["batch_size"] = trial.suggest_categorical("batch_size", BATCH_SIZES)
    train["schedule"] = trial.suggest_categorical("schedule", SCHEDULES)
    if train["schedule"] == "wsd":
        train["patience"] = max(int(train.get("patience", 10)), int(train.get("decay_patience", 3)) + 1)
    return raw


class _Recorder:
    """A trial that answers every suggestion with its first choice (or low end) and records what was asked."""

    def __init__(self) -> None:
        self.asked: dict[str, tuple[Any, ...]] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.asked[name] = ("categorical", tuple(choices))
        return choices[0]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.asked[name] = ("int", low, high)
        return low

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        self.asked[name] = ("float", low, high)
        return low


def fixed_problems(fixed: dict[str, Any], base: dict[str, Any], shape: DataShape) -> list[str]:
    """What is wrong with each ``--fix NAME=VALUE`` for this base config and data: a name its backbone does not
    search, a value outside the declared choices or range (Optuna fails the first trial on it, after the data
    has loaded and with a traceback in its log)."""
    recorder = _Recorder()
    suggest(recorder, base, shape)
    backbone = base.get("model", {}).get("backbone", "transformer")
    problems = []
    for name, value in fixed.items():
        asked = recorder.asked.get(name)
        if asked is None:
            problems.append(f"{name}: not searched for this config ({backbone})")
        elif asked[0] == "categorical" and value not in asked[1]:
            problems.append(f"{name}={value!r}: not one of {', '.join(map(str, asked[1]))}")
        elif asked[0] == "int" and not (isinstance(value, int) and asked[1] <= value <= asked[2]):
            problems.append(f"{name}={value!r}: not a whole number from {asked[1]} to {asked[2]}")
        elif asked[0] == "float" and not (isinstance(value, int | float) and not isinstance(value, bool)
                                          and asked[1] <= value <= asked[2]):
            problems.append(f"{name}={value!r}: not a number from {asked[1]} to {asked[2]}")
    return problems
