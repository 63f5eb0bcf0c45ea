"""The holdout retriever that mines the ranker's training groups, and what it may early-stop on.

The bundle's retriever has trained on every training position, so on those positions it is
far more confident than on the unseen validation and test targets (Beauty: recall@100 0.73 on
its own training targets against 0.29 on validation). A ranker mined from it learns to trust
the retrieval score too much. The holdout retriever is the bundle's config trained on the
training sequences without each user's last ``per_user`` items (`RankerConfig.holdout_per_user`,
default ``HOLDOUT_PER_USER`` = 2); they become the ranker's training targets, and their candidates
look like those served.

Early stopping must not look at a ranker training target either, or the holdout model's epoch
is chosen on the very items the ranker then learns from. So the holdout retriever early-stops
on the first held-out item (the ``per_user``-th last training item) of a fixed random share of users
(``HOLDOUT_STOP_SHARE``, drawn with the config's seed, as ``train.eval_users`` draws its sample), and
those items are left out of the ranker's training groups (`early_stop_positions`); the later held-out
items, which the holdout model neither trained nor early-stopped on, stay.

Under the temporal protocol (``split`` a `TemporalSplit`) the training sequences are every user's interactions
before the validation cut, so the holdout retriever, its early stopping and the ranker's training targets all lie
before that cut: nothing of the validation or test window is mined or learnt from.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from offline.data.sequences import Sequences
from offline.data.split import LeaveOneOut
from offline.data.temporal import TemporalSplit
from offline.evaluation.retriever import evaluation_rows
from ranker.config import HOLDOUT_PER_USER, HOLDOUT_STOP_SHARE
from retriever.artifact import RetrieverArtifact, load_artifact
from retriever.config import RunConfig

log = logging.getLogger(__name__)

HOLDOUT = "holdout-retriever"


def holdout_folder(per_user: int = HOLDOUT_PER_USER) -> str:
    """The holdout retriever's folder name in a mining folder: ``HOLDOUT`` for the default ``per_user``
    (every earlier release's name), ``HOLDOUT-N`` for another, so one is never reused for the other."""
    return HOLDOUT if per_user == HOLDOUT_PER_USER else f"{HOLDOUT}-{per_user}"


def training_sequences(data: PreparedDataset, split: LeaveOneOut | TemporalSplit | None = None) -> Sequences:
    """The training sequences mining holds out from: ``split``'s (leave-one-out's by default)."""
    return (split or data.split()).train


def holdout_users(data: PreparedDataset, per_user: int = HOLDOUT_PER_USER,
                  split: LeaveOneOut | TemporalSplit | None = None) -> np.ndarray:
    """Rows of ``data``'s users that the holdout dataset keeps (enough training items for its own split
    once the last ``per_user`` are held out)."""
    from offline.data.split import MIN_LENGTH

    return np.flatnonzero(training_sequences(data, split).lengths - (per_user - 2) >= MIN_LENGTH)


def holdout_data(data: PreparedDataset, per_user: int = HOLDOUT_PER_USER,
                 split: LeaveOneOut | TemporalSplit | None = None) -> PreparedDataset:
    """The training sequences as a dataset of their own: its split trains on all but each user's
    last ``per_user`` training items, validates on the first of them and tests on the next (the items
    after those are held out by being cut off)."""
    from dataclasses import replace

    from offline.data.split import MIN_LENGTH

    if per_user < 2:
        raise SeqrecError(f"holdout mining holds out at least 2 training items per user, got {per_user}")
    train = training_sequences(data, split)
    keep = holdout_users(data, per_user, split)
    if len(keep) == 0:
        raise SeqrecError(f"no user of {data.path} has {MIN_LENGTH + per_user - 2} or more training items for "
                          f"holdout mining of {per_user} per user")
    ends = train.lengths[keep] - (per_user - 2)  # the items after the split's own two are cut off
    rows = Sequences.from_lists([train.row(int(u))[:end].tolist() for u, end in zip(keep, ends, strict=True)])
    return replace(data, sequences=rows, user_ids=data.user_ids[keep])


def stop_users(n_users: int, config_users: int | None = None) -> int:
    """How many holdout users early-stop the holdout retriever: HOLDOUT_STOP_SHARE of them (at least
    one), or the bundle config's own ``train.eval_users`` sample when that is smaller."""
    share = max(1, round(HOLDOUT_STOP_SHARE * n_users))
    return share if config_users is None else min(share, config_users)


def holdout_config(config: RunConfig, repeats: str, n_users: int) -> RunConfig:
    """A bundle's run config with its resolved repeat policy (not "auto" again: the holdout data's
    own repeat share may differ) and early stopping on `stop_users` users only."""
    train = config.train
    return config.model_copy(update={"train": train.model_copy(update={
        "repeats": repeats, "eval_users": stop_users(n_users, train.eval_users)})})


def train_holdout_retriever(config: RunConfig, repeats: str, data: PreparedDataset, out: Path,
                            per_user: int = HOLDOUT_PER_USER,
                            split: LeaveOneOut | TemporalSplit | None = None) -> RetrieverArtifact:
    """Train (or reuse, or resume in) ``out`` the holdout retriever of a bundle trained with ``config``
    (as resolved in its artifact, or as loaded from its YAML: training resolves the same) under
    policy ``repeats`` on ``data`` without each user's last ``per_user`` training items."""
    from offline.jobs.train import train_retriever

    inner = holdout_data(data, per_user, split)
    wanted = holdout_config(config, repeats, inner.n_users)
    if (out / "manifest.json").exists():
        holdout = load_artifact(out)
        if _comparable(holdout.config) != _comparable(wanted):
            raise SeqrecError(f"{out} holds a holdout retriever with another config than the bundle's (or one from "
                              f"before early stopping on held-apart users); remove it or mine elsewhere")
        return holdout
    log.info("training the holdout retriever for mining on %d users (early stopping on %d of them) -> %s",
             inner.n_users, wanted.train.eval_users, out)
    train_retriever(wanted, inner, out, resume=(out / "run" / "last.pt").exists())
    return load_artifact(out)


def _comparable(config: RunConfig) -> dict[str, Any]:
    """A run config less what training fills in from the data (the item-feature vocabulary's size)."""
    raw = config.model_dump()
    for key in ("n_features", "features_per_item"):
        raw["model"].pop(key, None)
    return raw


def early_stop_positions(data: PreparedDataset, holdout: RetrieverArtifact, per_user: int = HOLDOUT_PER_USER,
                         split: LeaveOneOut | TemporalSplit | None = None) -> np.ndarray:
    """Absolute positions in ``data.split().train.items`` of the targets the holdout retriever (trained
    without each user's last ``per_user`` training items) early-stopped on: each sampled user's
    ``per_user``-th last training item (the sample from the holdout artifact's own config, so a holdout
    model from any release is read right)."""
    keep = holdout_users(data, per_user, split)
    train = holdout.config.train
    rows = evaluation_rows(len(keep), train.eval_users, train.seed)
    users = keep[rows]
    return training_sequences(data, split).offsets[users + 1] - per_user


def without_early_stop_targets(start: np.ndarray, target_pos: np.ndarray,
                               stop_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The training groups (history start, target position) whose target did not drive early stopping."""
    keep = ~np.isin(target_pos, stop_positions)
    return start[keep], target_pos[keep]
