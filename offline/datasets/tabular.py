"""Generic interaction logs: any CSV/TSV or Parquet file with named columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offline.datasets.base import RawDataset, int_if_integral
from offline.datasets.textio import read_delimited
from offline.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")


def read_tabular(
    path: str | Path,
    *,
    user_col: str = "user_id",
    item_col: str = "item_id",
    time_col: str | None = "timestamp",
    sep: str = ",",
    items_path: str | Path | None = None,
) -> RawDataset:
    """Read interactions from a CSV (with a header line) or Parquet file.

    time_col None: the file has no clock; the row order is the time order.
    items_path: an optional CSV/Parquet of item metadata keyed by ``item_col``; its other
        columns are kept as metadata (a ``genres``/``attributes`` column written as
        '|'-separated text becomes a list).
    """
    path = Path(path)
    wanted = [user_col, item_col] + ([time_col] if time_col else [])
    table = _read_columns(path, wanted, sep)
    times = table.column(time_col).combine_chunks() if time_col else pa.array(np.arange(table.num_rows))
    interactions = pa.table(
        {
            "user_id": _as_string(table.column(user_col).combine_chunks(), path, user_col),
            "item_id": _as_string(table.column(item_col).combine_chunks(), path, item_col),
            "timestamp": _as_clock(times, path, time_col or "row"),
        }
    )
    files = [path]
    items = None
    if items_path is not None:
        items_path = Path(items_path)
        items = _read_items(items_path, item_col, sep)
        files.append(items_path)
    return RawDataset(
        source="csv", interactions=interactions, items=items, has_timestamps=time_col is not None, files=files
    )


def _read_columns(path: Path, columns: list[str] | None, sep: str) -> pa.Table:
    if path.suffix.lower() in PARQUET_SUFFIXES:
        if not path.is_file():
            raise DataError(path, "no such file")
        try:
            names = pq.read_schema(path).names
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(path, f"not a readable Parquet file: {err}") from None
        missing = [c for c in columns or [] if c not in names]
        if missing:
            raise DataError(path, f"no column {missing[0]!r} (columns: {', '.join(names)})")
        table = pq.read_table(path, columns=columns)
        if table.num_rows == 0:
            raise DataError(path, "no data rows")
        return table
    return read_delimited(path, sep=sep, header=True, quoted=True, columns=columns)


def _as_string(values: pa.Array, path: Path, column: str) -> pa.Array:
    if values.null_count:
        raise DataError(path, f"column {column!r} has {values.null_count} empty values")
    return values if pa.types.is_string(values.type) else values.cast(pa.string())


def _as_clock(values: pa.Array, path: Path, column: str) -> pa.Array:
    """Timestamps as int64 (or float64 when fractional), whatever the column held."""
    if values.null_count:
        raise DataError(path, f"column {column!r} has {values.null_count} empty values")
    if pa.types.is_string(values.type):
        values = _parse_time_strings(values, path, column)
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        seconds = values.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy() / 1e6
        values = pa.array(seconds)
    if pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if pa.types.is_floating(values.type):
        if not np.isfinite(values.to_numpy(zero_copy_only=False)).all():
            raise DataError(path, f"column {column!r} holds non-finite timestamps")
        return int_if_integral(values)
    raise DataError(path, f"column {column!r} has type {values.type}, not a number or a date")


_TIME_TYPES = (pa.int64(), pa.float64(), pa.timestamp("us"))


def _parse_time_strings(values: pa.Array, path: Path, column: str) -> pa.Array:
    parsed = _cast_to_time(values)
    if parsed is not None:
        return parsed
    bad = next(v for v in values.to_pylist() if _cast_to_time(pa.array([v])) is None)
    raise DataError(path, f"column {column!r}: {bad!r} is neither a number nor an ISO date")


def _cast_to_time(values: pa.Array) -> pa.Array | None:
    """The first of int, float, timestamp that every value casts to; None if none does."""
    for target in _TIME_TYPES:
        try:
            return values.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def _read_items(path: Path, item_col: str, sep: str) -> pa.Table:
    table = _read_columns(path, None, sep)
    if item_col not in table.column_names:
        raise DataError(path, f"no column {item_col!r} (columns: {', '.join(table.column_names)})")
    columns = {"item_id": _as_string(table.column(item_col).combine_chunks(), path, item_col)}
    for name in table.column_names:
        if name == item_col:
            continue
        column = table.column(name).combine_chunks()
        if name in ("genres", "attributes") and pa.types.is_string(column.type):
            column = pc.split_pattern(column, "|")
        columns[name] = column
    return pa.table(columns)
