"""How the second stage is mined and trained: the one place its defaults are written.

`seqrec mine` and `seqrec train-ranker` take their flag defaults from here, the pipeline
config's ``ranker:`` section is a `RankerConfig` (with the bounds a config file is held to),
and `offline.jobs.rank.train_ranker` receives one. `MLPConfig` holds the MLP ranker's shape
and training defaults. Nothing here imports torch, so the CLI can build its parser cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.errors import SeqrecError

RankerKind = Literal["auto", "mlp", "lgbm", "none"]
Mining = Literal["holdout", "direct"]
Source = Literal["retriever", "cooc"]
SOURCES: tuple[str, ...] = ("retriever", "cooc")
# The kinds `train_ranker` fits; "none" exists only for a pipeline that ships the retriever alone.
TRAINABLE_KINDS: tuple[str, ...] = ("auto", "mlp", "lgbm")
MINING: tuple[str, ...] = ("holdout", "direct")
MIN_DEPTH = 10  # the metrics' largest cut-off: fewer candidates could not fill a top-10
MAX_DEPTH = 2000  # the deepest candidate list: a request's `candidates`; a pipeline's, train-ranker's, evaluate's depth
HOLDOUT_PER_USER = 2  # by default the holdout retriever never sees each user's last two training items
# Share of users whose second-to-last training item early-stops the holdout retriever; those items
# are then no ranker training target (offline/jobs/holdout.py).
HOLDOUT_STOP_SHARE = 0.2


class RankerConfig(BaseModel):
    """Which ranker to fit and how its training groups are mined."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: RankerKind = Field("auto", description="auto: train the MLP and LightGBM, keep the better on validation")
    mining: Mining = Field("holdout", description="holdout: groups mined by a sibling retriever that never saw "
                           "their targets; direct: by the bundle's own retriever")
    depth: int = Field(100, description="candidates per group (N): what is mined, trained, evaluated and served")
    per_user: int = Field(3, ge=1, description="direct mining: training targets per user (the most recent ones)")
    holdout_per_user: int = Field(
        HOLDOUT_PER_USER, ge=2, description="holdout mining: each user's last this many training items are what the "
        "holdout retriever never sees and the ranker's training targets (it early-stops on the first of them)")
    sources: tuple[Source, ...] = Field(
        ("retriever",), description="candidate sources: the retriever's FAISS list alone, or merged with the "
        "item-to-item co-occurrence list (`ranker.cooc.union`)")
    cooc_share: float = Field(0.25, ge=0.0, le=1.0, description="the depth slots offered to the cooc source")
    features: tuple[str, ...] = Field((), description="optional ranker features (`ranker.groups` columns) after "
                                      "the base ones")
    members: int = Field(1, ge=1, le=16, description="the MLP ranker as an ensemble of this many networks; "
                         "LightGBM ignores it")

    @property
    def holdout(self) -> bool:
        return self.mining == "holdout"

    @property
    def cooc_source(self) -> bool:
        return "cooc" in self.sources


class RankerSection(RankerConfig):
    """The pipeline config's ``ranker:`` section: a `RankerConfig` whose depth a config file must keep in
    range (the CLI leaves the depth's range to `offline.jobs.rank.mine_splits`)."""

    depth: int = Field(RankerConfig.model_fields["depth"].default, ge=MIN_DEPTH, le=MAX_DEPTH,
                       description=RankerConfig.model_fields["depth"].description)

    @field_validator("features")
    @classmethod
    def _known_features(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        # at load, not at the ranker stage after the retriever has trained
        from ranker.groups import check_names  # torch: only where a config is read

        return check_names(names)


@dataclass(frozen=True)
class MLPConfig:
    n_items: int
    n_meta: int
    n_year_buckets: int
    dim: int  # retriever vector size
    id_dim: int = 32
    meta_dim: int = 16
    year_dim: int = 8
    hidden: tuple[int, ...] = (256, 128)
    dropout: float = 0.1
    id_dropout: float = 0.1  # chosen on validation (docs/results/ranker-scaling): 0.3 before the scaling fix
    loss: Literal["listwise", "bce"] = "listwise"
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 256  # groups per step
    epochs: int = 30
    patience: int = 3
    seed: int = 42
    extra_features: tuple[str, ...] = ()  # optional `ranker.groups` columns read after the base dense features
    members: int = 1  # networks trained from seeds seed, seed + 1, ... and scored by their mean logit

    def __post_init__(self) -> None:
        check_mlp_training({"id_dropout": self.id_dropout, "dropout": self.dropout, "lr": self.lr,
                            "weight_decay": self.weight_decay, "batch_size": self.batch_size, "epochs": self.epochs,
                            "patience": self.patience, "members": self.members})


_MLP_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "id_dropout": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "dropout": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    # 0 trains nothing (a frozen control), as torch allows; inf passes ">= 0" and makes every weight NaN at once
    "lr": (lambda v: 0 <= v < math.inf, ">= 0 and finite"),
    "weight_decay": (lambda v: 0 <= v < math.inf, ">= 0 and finite"),
    **{name: (lambda v: v >= 1, ">= 1") for name in ("batch_size", "epochs", "patience", "members")},
}


def check_mlp_training(options: Mapping[str, float], label: Callable[[str], str] = str) -> None:
    """MLP ranker training options that cannot train a network: one `SeqrecError` naming the first, as ``label``
    spells it (the CLI checks its flags with it before mining; `MLPConfig` checks whatever builds one)."""
    for name, value in options.items():
        ok, wanted = _MLP_RULES[name]
        if not ok(value):
            raise SeqrecError(f"{label(name)} must be {wanted}, got {value}")


def ranker_default(name: str) -> Any:
    """The default of one `RankerConfig` field (for CLI flags)."""
    return RankerConfig.model_fields[name].default


def mlp_default(name: str) -> Any:
    """The default of one `MLPConfig` field (for CLI flags)."""
    return next(f.default for f in fields(MLPConfig) if f.name == name)
