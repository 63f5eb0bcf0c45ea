"""Generic interaction logs: any CSV/TSV or Parquet file with named columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offline.data.errors import DataError
from offline.data.readers.base import RawDataset, int_if_integral
from offline.data.readers.textio import check_unique, one_line, read_delimited, row_line

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
    table = _read_columns(path, wanted, sep, ids=[user_col, item_col])
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


def _read_columns(path: Path, columns: list[str] | None, sep: str, ids: list[str] | None = None) -> pa.Table:
    """``columns`` (None: all) of a Parquet file or a CSV with a header; ``ids``: columns where an empty CSV
    field is an error (Parquet's nulls and empty strings are caught by `_as_string`)."""
    if not _is_parquet(path):
        return read_delimited(path, sep=sep, header=True, quoted=True, columns=columns, non_empty=ids or ())
    if not path.is_file():
        raise DataError(path, "no such file")
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty")
    try:
        names = pq.read_schema(path).names
        missing = [c for c in columns or [] if c not in names]
        if missing:
            raise DataError(path, f"no column {missing[0]!r} (columns: {', '.join(names)})")
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as err:  # a broken footer or a corrupt page
        raise DataError(path, f"not a readable Parquet file: {one_line(err)}") from None
    if table.num_rows == 0:
        raise DataError(path, "no data rows")
    return table


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def _at(path: Path, row: int, message: str) -> DataError:
    """An error about data row ``row``: named by its line in a CSV, by its number in Parquet."""
    if _is_parquet(path):
        return DataError(path, f"row {row + 1}: {message}")
    return DataError(path, message, line=row_line(path, row, header=True))


def _as_string(values: pa.Array, path: Path, column: str) -> pa.Array:
    """Ids as strings; a null or empty id is an error."""
    try:
        text = values if pa.types.is_string(values.type) else values.cast(pa.string())
    except pa.ArrowException:
        raise DataError(path, f"column {column!r} has type {values.type}, not ids") from None
    empty = pc.or_kleene(pc.is_null(text), pc.equal(text, "")).fill_null(True)
    if pc.any(empty).as_py():
        first, count = int(pc.index(empty, True).as_py()), pc.sum(empty).as_py()
        raise _at(path, first, f"column {column!r} has {count} empty value{'' if count == 1 else 's'}")
    return text


def _as_clock(values: pa.Array, path: Path, column: str) -> pa.Array:
    """Timestamps as int64 (or float64 when fractional), whatever the column held."""
    if values.null_count:
        first, count = int(pc.index(pc.is_null(values), True).as_py()), values.null_count
        raise _at(path, first, f"column {column!r} has {count} empty value{'' if count == 1 else 's'}")
    if pa.types.is_string(values.type):
        values = _parse_time_strings(values, path, column)
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        seconds = values.cast(pa.timestamp("us")).cast(pa.int64()).to_numpy() / 1e6
        values = pa.array(seconds)
    if pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if pa.types.is_floating(values.type):
        finite = np.isfinite(values.to_numpy(zero_copy_only=False))
        if not finite.all():
            raise _at(path, int(np.argmin(finite)), f"column {column!r} holds non-finite timestamps")
        return int_if_integral(values)
    raise DataError(path, f"column {column!r} has type {values.type}, not a number or a date")


_TIME_TYPES = (pa.int64(), pa.float64(), pa.timestamp("us"))


def _parse_time_strings(values: pa.Array, path: Path, column: str) -> pa.Array:
    parsed = _cast_to_time(values)
    if parsed is not None:
        return parsed
    row, bad = next((row, v) for row, v in enumerate(values.to_pylist()) if _cast_to_time(pa.array([v])) is None)
    raise _at(path, row, f"column {column!r}: {bad!r} is neither a number nor an ISO date")


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
        raise DataError(path, f"no column {item_col!r} (columns: {', '.join(table.column_names)})",
                        line=None if _is_parquet(path) else 1)
    columns = {"item_id": _as_string(table.column(item_col).combine_chunks(), path, item_col)}
    check_unique(columns["item_id"], path, "item_id", header=None if _is_parquet(path) else True)
    for name in table.column_names:
        if name == item_col:
            continue
        column = table.column(name).combine_chunks()
        if name in ("genres", "attributes") and pa.types.is_string(column.type):
            column = pc.split_pattern(column, "|")
        columns[name] = column
    return pa.table(columns)
