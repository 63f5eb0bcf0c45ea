"""Warm-start retraining: a new model starts from a trained bundle's weights instead of from scratch.

The item table is carried over by *external* id: an item the bundle knew keeps its learned row,
wherever the new catalogue puts it; a new item keeps the fresh initialisation a model built from
scratch would give it. Side-feature embeddings (``model.item_features``) are carried over the same
way, by feature value. Every other weight must have the same shape in both models (same backbone
and sizes), else the warm start is refused. Only weights move: the optimiser, the learning-rate
schedule and early stopping start afresh (`retriever.train.fit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import Tensor

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from retriever.artifact import CATALOGUE, ArtifactError, load_artifact
from retriever.config import RunConfig
from retriever.features import feature_vocabulary
from retriever.model import Retriever

log = logging.getLogger(__name__)

ITEM_TABLE = "encoder.item_emb.weight"
FEATURE_TABLE = "encoder.feature_emb.weight"
FEATURE_IDS = "encoder.item_features"  # set from the new data, never copied


def warm_start_init(path: Path, config: RunConfig, data: PreparedDataset) -> Callable[[Retriever], dict[str, int]]:
    """A function that copies the bundle at ``path`` into a freshly built model for ``data``; it returns counts
    of what it carried over. Refuses (SeqrecError) a bundle of another backbone or size."""
    try:
        old = load_artifact(path, with_index=False)
    except ArtifactError as err:
        raise SeqrecError(f"--init-from: {err}") from None
    if old.config.model.backbone != config.model.backbone:
        raise SeqrecError(f"--init-from {path}: a {old.config.model.backbone} model cannot start a "
                          f"{config.model.backbone} one")
    old_items = [str(i) for i in old.item_ids.tolist()]
    new_items = [str(i) for i in data.item_ids[1:].tolist()]
    _check_overlap(path, old_items, new_items, data)
    column = config.model.item_features
    old_features = new_features = None
    if column:
        old_features = _bundle_vocabulary(path, column)
        new_features = list(feature_vocabulary(data.items.column(column).to_pylist())) \
            if column in data.items.column_names else []
    state = old.model.state_dict()

    def init(model: Retriever) -> dict[str, int]:
        target = model.state_dict()
        carried = {"items": 0, "new_items": 0, "features": 0, "tensors": 0}
        with torch.no_grad():
            for name, tensor in target.items():
                if name == FEATURE_IDS:
                    continue
                if name not in state:
                    raise SeqrecError(f"--init-from {path}: the bundle has no {name}; the models differ")
                source = state[name]
                if name == ITEM_TABLE:
                    carried["items"] = _copy_rows(source, tensor, old_items, new_items)
                    carried["new_items"] = len(new_items) - carried["items"]
                elif name == FEATURE_TABLE and old_features is not None and new_features is not None:
                    carried["features"] = _copy_rows(source, tensor, old_features, new_features)
                elif source.shape != tensor.shape:
                    raise SeqrecError(f"--init-from {path}: {name} is {tuple(source.shape)} in the bundle but "
                                      f"{tuple(tensor.shape)} here; warm start needs the same model sizes")
                else:
                    tensor.copy_(source)
                carried["tensors"] += 1
        log.info("warm start from %s: %d of %d items carried over, %d new; %d feature values carried", path,
                 carried["items"], len(new_items), carried["new_items"], carried["features"])
        return carried

    return init


def _check_overlap(path: Path, old_items: list[str], new_items: list[str], data: PreparedDataset) -> None:
    """Refuse a bundle of another catalogue, none of whose items the data holds: it started the run with only an
    INFO line ("0 of 1682 items carried over"), and the warm start carried nothing an item means. Warn when
    fewer than half the data's items are carried over."""
    shared = len(set(old_items).intersection(new_items))
    if shared == 0:
        example = f", e.g. {new_items[0]!r}" if new_items else ""
        raise SeqrecError(f"--init-from {path}: none of its {len(old_items)} item ids is in {data.path} "
                          f"({len(new_items)} items{example}); a warm start carries item rows over by id, so it "
                          "needs a bundle trained on this catalogue (or an earlier state of it)")
    if shared < len(new_items) / 2:
        log.warning("warm start from %s: only %d of %d items carried over; the other %d start from scratch", path,
                    shared, len(new_items), len(new_items) - shared)


def _copy_rows(source: Tensor, target: Tensor, old_keys: list[str], new_keys: list[str]) -> int:
    """Copy ``source`` row 1 + i (key ``old_keys[i]``) into ``target`` row 1 + j where ``new_keys[j]`` is the same
    key; rows past the keyed ones (e.g. BERT4Rec's mask token) are copied end to end. Returns the rows copied."""
    if source.shape[1:] != target.shape[1:]:
        raise SeqrecError(f"warm start needs the same embedding width: {tuple(source.shape)} vs "
                          f"{tuple(target.shape)}")
    where = {key: row + 1 for row, key in enumerate(old_keys)}
    pairs = np.array([(where[k], j + 1) for j, k in enumerate(new_keys) if k in where], dtype=np.int64).reshape(-1, 2)
    if len(pairs):
        target[torch.from_numpy(pairs[:, 1])] = source[torch.from_numpy(pairs[:, 0])].to(target.dtype)
    extra_old, extra_new = source.shape[0] - len(old_keys) - 1, target.shape[0] - len(new_keys) - 1
    if extra_old > 0 and extra_old == extra_new:
        target[-extra_new:] = source[-extra_old:]
    return len(pairs)


def _bundle_vocabulary(path: Path, column: str) -> list[str]:
    file = path / CATALOGUE
    if not file.is_file():
        raise SeqrecError(f"--init-from {path}: the bundle has no {CATALOGUE}, so its {column!r} feature ids "
                          "cannot be matched to the new data's")
    table = pq.read_table(file)
    if column not in table.column_names:
        raise SeqrecError(f"--init-from {path}: its catalogue has no {column!r} column")
    return list(feature_vocabulary(table.column(column).to_pylist()))
