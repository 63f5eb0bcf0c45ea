"""The interactions of a pipeline config's data on one clock: what happened before a time, and in a window.

Rows are sorted stably by time (ties keep the reader's order, as `seqrec prepare` sorts). The filters that act on
single rows (``min_rating``) apply here; those that act on users and items (``min_user_interactions``, ``k_core``)
are the pipeline's, applied by each step's prepare stage to what happened before the step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from common.errors import SeqrecError
from offline.data.readers import ReaderOptions, read_dataset
from offline.data.readers.base import ITEM, TIME, USER
from offline.jobs.pipeline_config import PipelineConfig

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


@dataclass(frozen=True)
class Timeline:
    users: np.ndarray  # (n,) external user id of each row, object array of str, rows in time order
    items: np.ndarray  # (n,) external item id
    times: np.ndarray  # (n,) float64 seconds, non-decreasing
    items_table: pa.Table | None  # the reader's item metadata
    resolution: float  # the clock's resolution: the largest unit every timestamp is a multiple of (seconds)

    def before(self, t: float) -> int:
        """The number of rows strictly before ``t`` (they are the first rows)."""
        return int(np.searchsorted(self.times, t, side="left"))

    def window(self, t0: float, t1: float) -> slice:
        return slice(self.before(t0), self.before(t1))


def parse_step(text: str) -> float:
    """'1d', '7d', '12h', '30m', '3600s' or '3600' -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise SeqrecError(f"--step {text!r}: give a positive length such as 1d, 7d, 12h, 30m or 3600s")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_start(text: str) -> float:
    """An ISO date or date-time (UTC when no offset is given) or unix seconds -> unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise SeqrecError(f"--start {text!r}: give an ISO date (1998-03-01, 1998-03-01T12:00) or unix "
                          "seconds") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def load_timeline(config: PipelineConfig) -> Timeline:
    """The config's data, read as its prepare stage would read it, on one clock; refuses data without one."""
    d = config.data
    raw = read_dataset(d.dataset, ReaderOptions(path=d.path, synthetic=d.synthetic or None, **d.reader))
    if not raw.has_timestamps:
        raise SeqrecError(f"{d.dataset}: the data has no clock (only an order), so there is no time to backtest on")
    table = raw.interactions
    if d.min_rating is not None:
        if "rating" not in table.column_names:
            raise SeqrecError(f"min_rating given but the {raw.source} data has no ratings")
        table = table.filter(pc.greater_equal(table.column("rating"), d.min_rating))
    if table.num_rows == 0:
        raise SeqrecError(f"{d.dataset}: no interactions to backtest on")
    times = table.column(TIME).to_numpy(zero_copy_only=False).astype(np.float64)
    order = np.argsort(times, kind="stable")
    return Timeline(users=_strings(table, USER)[order], items=_strings(table, ITEM)[order], times=times[order],
                    items_table=raw.items, resolution=clock_resolution(times))


def _strings(table: pa.Table, column: str) -> np.ndarray:
    return np.asarray(table.column(column).to_pylist(), dtype=object)


def clock_resolution(times: np.ndarray) -> float:
    """The largest of 1 s, 1 min, 1 h, 1 d that divides every timestamp (a finer clock: the smallest gap)."""
    if not np.all(times == np.floor(times)):
        gaps = np.diff(np.unique(times))
        return float(gaps.min()) if len(gaps) else 1.0
    whole = times.astype(np.int64)
    divisor = math.gcd(*np.unique(whole).tolist()) if len(whole) else 1
    for unit in (86_400, 3600, 60, 1):
        if divisor % unit == 0 and divisor:
            return float(unit)
    return 1.0


def check_plan(timeline: Timeline, start: float, step: float, steps: int) -> list[tuple[float, float]]:
    """The steps' windows [t, t + step); refuses, before any training, a plan with an empty training set or an
    empty window, a start outside the data, or a step shorter than the clock's resolution."""
    first, last = float(timeline.times[0]), float(timeline.times[-1])
    if steps < 1:
        raise SeqrecError(f"--steps must be >= 1, got {steps}")
    if step < timeline.resolution:
        raise SeqrecError(f"--step of {step:g} s is shorter than the data's clock resolution "
                          f"({timeline.resolution:g} s)")
    if not first < start <= last:
        raise SeqrecError(f"--start {iso(start)} is outside the data: its interactions run from {iso(first)} to "
                          f"{iso(last)}, and the first step needs some before it")
    windows = [(start + i * step, start + (i + 1) * step) for i in range(steps)]
    for i, (t0, t1) in enumerate(windows):
        part = timeline.window(t0, t1)
        if part.stop == part.start:
            raise SeqrecError(f"step {i + 1} of {steps}: the window {iso(t0)} .. {iso(t1)} holds no interaction "
                              f"(the data ends at {iso(last)}); use fewer steps, a longer step or an earlier start")
    return windows


def write_training(timeline: Timeline, t: float, folder: Path) -> tuple[Path, Path | None]:
    """The interactions before ``t`` (and the item metadata) as Parquet files a pipeline's csv reader reads."""
    folder.mkdir(parents=True, exist_ok=True)
    n = timeline.before(t)
    interactions = pa.table({USER: pa.array(timeline.users[:n].tolist(), pa.string()),
                             ITEM: pa.array(timeline.items[:n].tolist(), pa.string()),
                             TIME: pa.array(timeline.times[:n])})
    pq.write_table(interactions, folder / "interactions.parquet")
    if timeline.items_table is None:
        return folder / "interactions.parquet", None
    pq.write_table(timeline.items_table, folder / "items.parquet")
    return folder / "interactions.parquet", folder / "items.parquet"


def write_step_config(config: PipelineConfig, data: Path, folder: Path, name: str, *, overrides: dict[str, Any],
                      keep: int) -> Path:
    """``folder/<name>.yaml``: the user's pipeline config reading the interactions ``write_training`` wrote to
    ``data``, with ``overrides`` added to its retriever overrides."""
    interactions, items = data / "interactions.parquet", data / "items.parquet"
    raw = config.model_dump(mode="json", exclude_none=True)
    raw["data"] = {"dataset": "csv", "path": str(interactions.resolve()),
                   "reader": {"items_path": str(items.resolve())} if items.is_file() else {},
                   "min_user_interactions": config.data.min_user_interactions}
    if config.data.k_core is not None:
        raw["data"]["k_core"] = config.data.k_core
    if overrides:
        raw["overrides"] = {**raw.get("overrides", {}), **overrides}
    raw["keep"] = keep
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
