"""The pipeline's sized defaults: the prepared data's statistics and the device -> `retriever.sizing`'s rules ->
the values of the keys the pipeline config leaves unset.

Sizing applies to a pipeline config with no `retriever:` file and no `tune:` search (only `name` and `data`, say):
its keys are the built-in defaults' replacements. A key the config's `overrides:` (or `--threads`) names is given
and never sized. The record (`SizingRecord`) says which values were sized, with the rule and the statistics, and
which were given; the train stage stores it in the bundle's pipeline.json and prints it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel

from offline.data.prepared import PreparedDataset
from retriever.sizing import DataShape, Device, sized_settings

log = logging.getLogger(__name__)


class SizingRecord(BaseModel):
    """What sizing decided: the statistics and device it read, the sized values with their rules, the given ones."""

    applied: bool
    statistics: dict[str, Any] = {}
    device: dict[str, Any] = {}
    sized: dict[str, Any] = {}
    rules: dict[str, str] = {}
    given: dict[str, Any] = {}


def data_shape(data: PreparedDataset) -> DataShape:
    """The training sequences' statistics (the leave-one-out split's train part: what the retriever learns from)."""
    train = data.split().train
    lengths = np.asarray(train.lengths, dtype=np.float64)
    quantiles = {f"q{q}": float(np.quantile(lengths, q / 100)) if len(lengths) else 0.0 for q in (50, 90, 95)}
    return DataShape(interactions=int(lengths.sum()), users=data.n_users, items=data.n_items,
                     mean_length=round(float(lengths.mean()) if len(lengths) else 0.0, 2),
                     length_quantiles=quantiles, feature_columns=list_columns(data.items))


def list_columns(items: pa.Table) -> dict[str, int]:
    """The catalogue's list-valued columns (side features such as genres or attributes) -> distinct values."""
    out: dict[str, int] = {}
    for name in items.column_names:
        column = items.column(name)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            values = {v for row in column.to_pylist() if row for v in row}
            if values:
                out[name] = len(values)
    return out


def device_now(threads: int | None, wanted: str = "auto") -> Device:
    """The device the retriever will train on (``wanted``: a given ``train.device``)."""
    import torch

    if wanted != "cpu" and torch.cuda.is_available():
        return Device("cuda", threads or torch.get_num_threads())
    return Device("cpu", threads or torch.get_num_threads())


def sizing_applies(has_retriever_file: bool, has_tune: bool) -> bool:
    """Only the built-in defaults are sized: a retriever file names its own settings, a search picks its own."""
    return not has_retriever_file and not has_tune


def size_values(shape: DataShape, device: Device, given: Mapping[str, Any]) -> tuple[dict[str, Any], SizingRecord]:
    """The sized values of every key not in ``given`` merged with ``given`` (which wins), and the record."""
    settings = sized_settings(shape, device)
    sized = {key: s.value for key, s in settings.items() if key not in given}
    record = SizingRecord(applied=True, statistics=shape.record(), device=device.record(), sized=sized,
                          rules={key: settings[key].rule for key in sized}, given=dict(given))
    return {**sized, **given}, record


def sizing_lines(record: SizingRecord) -> list[str]:
    """The record as the lines the pipeline prints at the train stage's start."""
    if not record.applied:
        return ["sizing: off (the config names its retriever settings)"]
    stats = record.statistics
    q = stats["length_quantiles"]
    lines = [f"sizing from {stats['interactions']} training interactions, {stats['users']} users, "
             f"{stats['items']} items, mean length {stats['mean_length']} (q50 {q['q50']:.0f}, q95 {q['q95']:.0f}), "
             f"density {stats['density']:.5f} on {record.device['kind']} ({record.device['precision']}, "
             f"{record.device['threads']} threads)"]
    lines += [f"  sized {key} = {value}  ({record.rules[key]})" for key, value in record.sized.items()]
    lines += [f"  given {key} = {value}" for key, value in record.given.items()]
    return lines
