"""A retriever's own evaluation: full-ranking metrics of its vectors (training, tuning and `seqrec evaluate`), of its
index as served, on all users or the fixed sample ``train.eval_users`` draws, and the checks an evaluation makes
of the artifact against the data first."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from offline.data.split import LeaveOneOut, Split
from offline.evaluation.evaluate import EVAL_KS, evaluate_vectors, index_target_ranks, summarize
from retriever.artifact import RetrieverArtifact, load_artifact
from retriever.model import Retriever

if TYPE_CHECKING:
    from offline.data.temporal import TemporalSplit

Sampled = TypeVar("Sampled", "LeaveOneOut", "TemporalSplit", "LeaveOneOut | TemporalSplit")


def dense_metrics(model: Retriever, split: LeaveOneOut | TemporalSplit, n_items: int, max_len: int,
                  splits: tuple[Split, ...] = ("valid", "test"), batch_size: int | None = None,
                  ks: tuple[int, ...] = EVAL_KS, *, exclude_seen: bool = True) -> dict[str, Any]:
    """Full-ranking metrics of a retriever, streamed over users and item blocks (any catalogue size)."""
    model.eval()
    with torch.inference_mode():
        items = model.item_vectors()  # (n_items + 1, D), on the model's device
    return evaluate_vectors(model.user_vectors, items, split, scale=model.temperature, splits=splits, ks=ks,
                            batch_size=batch_size, max_len=max_len, exclude_seen=exclude_seen)


def evaluation_rows(n_users: int, users: int | None, seed: int) -> np.ndarray:
    """The sorted rows that ``train.eval_users`` = ``users`` draws out of ``n_users`` (all when None or more)."""
    if users is None or users >= n_users:
        return np.arange(n_users)
    return np.sort(np.random.default_rng(seed).choice(n_users, size=users, replace=False))


def evaluation_sample(split: Sampled, users: int | None, seed: int) -> Sampled:
    """``split`` itself, or a fixed random sample of ``users`` of its users (``train.eval_users``)."""
    if users is None or users >= len(split.full):
        return split
    return split.take(evaluation_rows(len(split.full), users, seed))


def index_metrics(artifact: RetrieverArtifact, split: LeaveOneOut, splits: tuple[Split, ...] = ("valid", "test"),
                  ks: tuple[int, ...] = EVAL_KS) -> dict[str, Any]:
    model = artifact.model
    out: dict[str, Any] = {}
    for name in splits:
        ranks = index_target_ranks(
            model.user_vectors, artifact.index, split.inputs(name), split.targets(name), artifact.n_items,
            depth=max(ks), max_len=artifact.max_len, exclude_seen=artifact.manifest.exclude_seen,
            desc=f"{name} (index)",
        )
        out[name] = summarize(ranks, ks)
    return out


def repeat_record(artifact: RetrieverArtifact, data: PreparedDataset) -> dict[str, Any]:
    """What every evaluation output repeats: the policy it followed and the data's repeat shares."""
    return {"repeats": artifact.manifest.repeats, "repeat_targets": data.repeat_shares}


def check_catalogue(artifact: RetrieverArtifact, data: PreparedDataset) -> None:
    """The artifact's internal ids must mean the same items as the data's."""
    ours, theirs = artifact.item_ids.astype(str), data.item_ids[1:].astype(str)
    if np.array_equal(ours, theirs):
        return
    raise SeqrecError(f"{artifact.path} was trained on a different item catalogue than {data.path}: "
                      f"{_catalogue_difference(ours, theirs, str(data.path))}")


def _catalogue_difference(ours: np.ndarray, theirs: np.ndarray, where: str) -> str:
    """What tells the artifact's item ids ``ours`` from the data's ``theirs`` (at ``where``), in a few words: the
    counts alone read "58 items than ... (58 items)" for two catalogues of other ids."""
    known = set(ours.tolist())
    new = sorted(set(theirs.tolist()) - known)
    gone = sorted(known - set(theirs.tolist()))
    parts = [f"the artifact has {len(ours)} items, the data {len(theirs)}"] if len(ours) != len(theirs) else []
    if new:
        parts.append(f"{len(new)} of {where}'s item ids are not in the artifact (e.g. {new[0]!r})")
    if gone:
        parts.append(f"{len(gone)} of the artifact's item ids are not in {where} (e.g. {gone[0]!r})")
    if not new and not gone:
        parts.append(f"the same {len(ours)} item ids in another order, so its internal ids mean other items")
    return "; ".join(parts)


def evaluate_artifact(path: Path, data: PreparedDataset, *, ks: tuple[int, ...] = EVAL_KS,
                      use_index: bool = True, batch_size: int | None = None) -> dict[str, Any]:
    artifact = load_artifact(path, with_index=use_index)
    check_catalogue(artifact, data)
    split = data.split()
    model = artifact.model

    dense = dense_metrics(model, split, data.n_items, artifact.max_len, batch_size=batch_size, ks=ks,
                          exclude_seen=artifact.manifest.exclude_seen)
    result: dict[str, Any] = {"artifact": str(path), "version": artifact.manifest.version,
                              **repeat_record(artifact, data), **dense}
    if use_index:
        result["index"] = {"spec": artifact.manifest.index, **index_metrics(artifact, split, ks=ks)}
    return result
