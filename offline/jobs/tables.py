"""The tables a ranker's features read beside the groups, from training positions only: item statistics,
the co-occurrence table, the request-time table, and each group's request time.

A training group's tables leave out each user's last ``drop_last`` training items (the group's own target
among them), so no statistic counts the target it is trained to find.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from common.errors import SeqrecError
from offline.data.features import item_feature_matrix
from offline.data.prepared import PreparedDataset
from offline.data.sequences import Sequences
from offline.data.split import LeaveOneOut
from offline.data.temporal import TemporalSplit
from ranker.config import RankerConfig
from ranker.cooc import CoocTable
from ranker.groups import Extras, request_time, requiring, table_kind, tables_for
from ranker.mining import Mined
from ranker.tables import ItemTables
from ranker.times import TimeTable
from ranker.train import FeatureSource

META_COLUMNS = ("genres", "attributes")


def item_tables(data: PreparedDataset, split: LeaveOneOut | TemporalSplit, drop_last: int = 0) -> ItemTables:
    """Popularity, known flags and "follows" counts from training positions (without each user's
    last ``drop_last`` training items); metadata and years from the catalogue."""
    columns = data.items.column_names
    meta = next((item_feature_matrix(data, c)[0] for c in META_COLUMNS if c in columns), None)
    years = None
    if "year" in columns:
        years = np.array([np.nan, *[np.nan if y is None else y for y in data.items.column("year").to_pylist()]],
                         dtype=np.float64)
    train = _training_positions(split, drop_last)
    return ItemTables.build(train.offsets, train.items, data.n_items, meta, years)


def cooc_table(data: PreparedDataset, split: LeaveOneOut | TemporalSplit, drop_last: int = 0) -> CoocTable:
    """The co-occurrence source's table from training positions (without each user's last ``drop_last``)."""
    train = _training_positions(split, drop_last)
    return CoocTable.build(train.offsets, train.items, data.n_items)


def time_table(data: PreparedDataset, split: LeaveOneOut | TemporalSplit, drop_last: int = 0) -> TimeTable:
    """The request-time features' table (`ranker.times`) from training positions (without each user's last
    ``drop_last``)."""
    if not has_clock(data):
        raise SeqrecError(f"{data.path} has no timestamps (only an order); the request-time ranker features "
                          f"({', '.join(request_time.COLUMNS)}) need them")
    train = _training_positions(split, drop_last)
    assert train.timestamps is not None
    try:
        return TimeTable.build(train.items, train.timestamps, data.n_items)
    except ValueError as err:
        raise SeqrecError(f"{data.path}: {err}") from None


def has_clock(data: PreparedDataset) -> bool:
    """Whether the data's timestamps are times (S3-Rec lines and some RecBole files give positions only)."""
    return data.sequences.timestamps is not None and bool(data.manifest.get("has_timestamps", True))


def require_clock(path: Path, manifest: dict[str, Any], features: tuple[str, ...]) -> None:
    """Refuse request-time ranker features on prepared data (its manifest) whose timestamps are only an order."""
    timed = requiring(features, "timestamps")
    if timed and not manifest.get("has_timestamps", True):
        raise SeqrecError(f"{path} has no timestamps (only an order); the request-time ranker features "
                          f"({', '.join(timed)}) need them")


def request_times(split: LeaveOneOut | TemporalSplit, name: str, mined: Mined) -> tuple[np.ndarray, np.ndarray]:
    """(G,) each group's request time, its target's timestamp (a training target's, or the user's validation or
    test target's: the time a served request for that prediction is made), and (G,) the time of the newest
    item of its history. Under the temporal protocol the validation and test groups are its window's warm users,
    in the window's order, and the target is each one's next item at or after the cut."""
    if isinstance(split, TemporalSplit) and name != "train":
        window = split.window(name)  # type: ignore[arg-type]
        source = split.train if name == "valid" else window.inputs
        assert window.horizon.timestamps is not None
        assert source.timestamps is not None
        return (np.asarray(window.horizon.timestamps[window.horizon.offsets[:-1]], dtype=np.float64),
                np.asarray(source.timestamps[mined.end - 1], dtype=np.float64))
    full = split.full
    inputs = split.train if name in ("train", "valid") else split.inputs("test")
    assert full.timestamps is not None
    assert inputs.timestamps is not None
    last_event = np.asarray(inputs.timestamps[mined.end - 1], dtype=np.float64)
    if name == "train":  # the target is items[end] of the training sequences
        return np.asarray(inputs.timestamps[mined.end], dtype=np.float64), last_event
    user = np.searchsorted(inputs.offsets, mined.start, "right") - 1
    back = 1 if name == "test" else 2
    return np.asarray(full.timestamps[full.offsets[user + 1] - back], dtype=np.float64), last_event


def _training_positions(split: LeaveOneOut | TemporalSplit, drop_last: int) -> Sequences:
    """The split's training sequences (with their timestamps), less each user's last ``drop_last`` items."""
    train = split.train
    if not drop_last:
        return train
    keep_len = np.maximum(train.lengths - drop_last, 0)
    keep = np.arange(len(train.items)) - np.repeat(train.offsets[:-1], train.lengths) < np.repeat(keep_len,
                                                                                                  train.lengths)
    offsets = np.concatenate([[0], np.cumsum(keep_len)]).astype(np.int64)
    return Sequences(offsets, train.items[keep], None if train.timestamps is None else train.timestamps[keep])


def extra_tables(data: PreparedDataset, config: RankerConfig, split: LeaveOneOut | TemporalSplit | None = None,
                 drop_last: int = 0) -> dict[str, Any]:
    """The tables (by `ranker.groups.TableKind` name) that the config's sources and extra features read, from
    training positions (without each user's last ``drop_last``)."""
    split = split or data.split()
    names = [*(["cooc"] if config.cooc_source else []), *tables_for(config.features)]
    builders = {"cooc": cooc_table, "times": time_table}  # with these kinds' checks; any other kind: its own build
    out: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        if name in builders:
            out[name] = builders[name](data, split, drop_last)
        else:
            train = _training_positions(split, drop_last)
            out[name] = table_kind(name).build(train.offsets, train.items, train.timestamps, data.n_items)
    return out


def with_extras(source: FeatureSource, config: RankerConfig, saved: dict[str, Any]) -> FeatureSource:
    """``source`` computing the config's extra features from the ``saved`` tables too."""
    if not config.features:
        return source
    return FeatureSource(source.tables, source.item_vectors,
                         Extras(tuple(config.features), {name: table_kind(name).runtime(saved[name])
                                                         for name in tables_for(config.features)}))
