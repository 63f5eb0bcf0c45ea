"""Generic interaction logs: any CSV/TSV or Parquet file with named columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import SeqrecError
from offline.data.errors import DataError
from offline.data.readers.base import RawDataset, int_if_integral
from offline.data.readers.textio import check_unique, one_line, read_delimited, row_line, shown_value

PARQUET_SUFFIXES = (".parquet", ".pq")
# The columns `prepare` writes to items.parquet itself: item_idx, and item_id for the --item-col values.
RESERVED_ITEM_COLUMNS = ("item_idx", "item_id")


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
    check_sep(sep)
    _check_roles({"--user-col": user_col, "--item-col": item_col, "--time-col": time_col})
    wanted = [user_col, item_col] + ([time_col] if time_col else [])
    table = _read_columns(path, wanted, sep, ids=[user_col, item_col])
    times = table.column(time_col).combine_chunks() if time_col else pa.array(np.arange(table.num_rows))
    interactions = pa.table(
        {
            "user_id": _as_string(table.column(user_col).combine_chunks(), path, user_col, sep),
            "item_id": _as_string(table.column(item_col).combine_chunks(), path, item_col, sep),
            "timestamp": _as_clock(times, path, time_col or "row", sep),
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


def parse_sep(text: str) -> str:
    """--sep as typed: backslash escapes ('\\t' for a tab) decoded, then checked by `check_sep`."""
    try:
        sep = text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        raise SeqrecError(f"--sep {text!r} holds an incomplete backslash escape; write '\\t' for a tab, "
                          "'\\\\' for a backslash") from None
    check_sep(sep)
    return sep


def check_sep(sep: str) -> None:
    """The CSV reader splits on one character (its quoting rules need that); a line break cannot be one."""
    if len(sep) != 1 or sep in "\r\n":
        raise SeqrecError(f"--sep must be one character other than a line break, got {sep!r} "
                          "(write '\\t' for a tab)")


def _check_roles(columns: dict[str, str | None]) -> None:
    """One column cannot be both the user and the item (or the clock): each role needs its own."""
    seen: dict[str, str] = {}
    for flag, name in columns.items():
        if name is None:
            continue
        if name in seen:
            raise SeqrecError(f"{seen[name]} and {flag} name the same column {name!r}; give each its own column "
                              "(defaults: user_id, item_id, timestamp)")
        seen[name] = flag


def _read_columns(path: Path, columns: list[str] | None, sep: str, ids: list[str] | None = None) -> pa.Table:
    """``columns`` (None: all) of a Parquet file or a CSV with a header; ``ids``: columns where an empty CSV
    field is an error (Parquet's nulls and empty strings are caught by `_as_string`)."""
    if not _is_parquet(path):  # a TSV has no quoting (IANA text/tab-separated-values): '"big" box' is that id
        return read_delimited(path, sep=sep, header=True, quoted=_quoted(sep), columns=columns, non_empty=ids or ())
    if not path.is_file():
        raise DataError(path, "no such file")
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty")
    try:
        names = pq.read_schema(path).names
        missing = [c for c in columns or [] if c not in names]
        if missing:
            raise DataError(path, f"no column {missing[0]!r} (columns: {', '.join(names)})")
        repeated = [c for c in columns or names if names.count(c) > 1]
        if repeated:
            raise DataError(path, f"column {repeated[0]!r} appears {names.count(repeated[0])} times; "
                            "rename all but one")
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as err:  # a broken footer or a corrupt page
        raise DataError(path, f"not a readable Parquet file: {one_line(err)}") from None
    if table.num_rows == 0:
        raise DataError(path, "no data rows")
    return table


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def _at(path: Path, row: int, message: str, sep: str) -> DataError:
    """An error about data row ``row``: named by its line in a CSV (a quoted field may span lines), by its number
    in Parquet."""
    if _is_parquet(path):
        return DataError(path, f"row {row + 1}: {message}")
    return DataError(path, message, line=_line(path, row, sep))


def _line(path: Path, row: int, sep: str) -> int:
    return row_line(path, row, header=True, quoted=_quoted(sep), sep=sep)


def _quoted(sep: str) -> bool:
    """Whether a delimited file's fields may be quoted: a CSV's, not a TSV's (IANA text/tab-separated-values)."""
    return sep != "\t"


def _row_name(path: Path, row: int, sep: str) -> str:
    return f"row {row + 1}" if _is_parquet(path) else f"line {_line(path, row, sep)}"


def _as_string(values: pa.Array, path: Path, column: str, sep: str) -> pa.Array:
    """Ids as strings; a null, NaN or empty id is an error."""
    try:
        text = values if pa.types.is_string(values.type) else values.cast(pa.string())
    except pa.ArrowException:
        raise DataError(path, f"column {column!r} has type {values.type}, not ids") from None
    # NaN is how pandas writes a missing value to a float column; cast, it would become the id "nan".
    empty = pc.or_kleene(pc.is_null(values, nan_is_null=True), pc.equal(text, "")).fill_null(True)
    if pc.any(empty).as_py():
        first, count = int(pc.index(empty, True).as_py()), pc.sum(empty).as_py()
        raise _at(path, first, f"column {column!r} has {count} empty value{'' if count == 1 else 's'}", sep)
    return text


def _as_clock(values: pa.Array, path: Path, column: str, sep: str) -> pa.Array:
    """Timestamps as int64 (or float64 when fractional), whatever the column held."""
    if values.null_count:
        first, count = int(pc.index(pc.is_null(values), True).as_py()), values.null_count
        raise _at(path, first, f"column {column!r} has {count} empty value{'' if count == 1 else 's'}", sep)
    if pa.types.is_large_string(values.type) or pa.types.is_string_view(values.type):
        values = values.cast(pa.string())
    if pa.types.is_string(values.type):
        values = _parse_time_strings(values, path, column, sep)
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        try:
            micros = values.cast(pa.timestamp("us"))
        except pa.ArrowInvalid:  # nanoseconds that are no whole microsecond
            exact = values.cast(pa.timestamp("us"), safe=False).cast(values.type)
            row = int(pc.index(pc.not_equal(exact, values), True).as_py())
            raise _at(path, row, f"column {column!r} holds times finer than a microsecond, which seqrec's clock "
                      "(seconds, to the microsecond) cannot order; round them to microseconds", sep) from None
        values = pa.array(micros.cast(pa.int64()).to_numpy() / 1e6)
    if pa.types.is_integer(values.type):
        if pa.types.is_uint64(values.type) and len(values) and pc.max(values).as_py() > 2**63 - 1:
            row = int(np.argmax(values.to_numpy(zero_copy_only=False) > np.uint64(2**63 - 1)))
            raise _at(path, row, f"column {column!r} holds a timestamp above 2**63 - 1", sep)
        return values.cast(pa.int64())
    if pa.types.is_floating(values.type):
        finite = np.isfinite(values.to_numpy(zero_copy_only=False))
        if not finite.all():
            raise _at(path, int(np.argmin(finite)), f"column {column!r} holds non-finite timestamps", sep)
        return int_if_integral(values)
    raise DataError(path, f"column {column!r} has type {values.type}, not a number or a date")


# ISO dates with a zone ("...T10:00:00Z", "+02:00") parse only as zoned timestamps (kept in UTC); those without
# one only as naive timestamps, read as UTC.
_TIME_TYPES = (pa.int64(), pa.float64(), pa.timestamp("us"), pa.timestamp("us", tz="UTC"), pa.timestamp("ns"),
               pa.timestamp("ns", tz="UTC"))  # nanoseconds: refused by `_as_clock` unless whole microseconds
_NUMBER = r"^\s*[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|(?i:inf|infinity|nan))\s*$"  # what casts to float64
_ZONED = r"\d:\d\d(:\d\d(\.\d+)?)?\s*((?i:z)|[+-]\d\d(:?\d\d)?)\s*$"  # a time of day, then a zone
_KINDS = ("numbers", "dates", "dates with a zone")


def _parse_time_strings(values: pa.Array, path: Path, column: str, sep: str) -> pa.Array:
    parsed = _cast_to_time(values)
    if parsed is not None:
        return parsed
    for row, value in enumerate(values.to_pylist()):
        if _cast_to_time(pa.array([value])) is None:
            raise _at(path, row, f"column {column!r}: {shown_value(str(value))} is neither a number nor an ISO date",
                      sep)
    # Each value parses alone, so they are of different kinds.
    number = pc.match_substring_regex(values, _NUMBER).to_numpy(zero_copy_only=False)
    zoned = pc.match_substring_regex(values, _ZONED).to_numpy(zero_copy_only=False)
    kind = np.where(number, 0, np.where(zoned, 2, 1))
    other = int(np.argmax(kind != kind[0]))
    first, second = sorted((int(kind[0]), int(kind[other])))
    raise _at(path, other, f"column {column!r} mixes {_KINDS[first]} and {_KINDS[second]}: "
              f"{shown_value(values[other].as_py())} here, {shown_value(values[0].as_py())} at "
              f"{_row_name(path, 0, sep)}; write every timestamp the same way", sep)


def _cast_to_time(values: pa.Array) -> pa.Array | None:
    """The first of int, float, timestamp that every value casts to; None if none does."""
    for target in _TIME_TYPES:
        try:
            return values.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


def _value_lists(column: pa.Array) -> pa.Array:
    """'Drama|War' -> ['Drama', 'War']; an empty field, or 'a||b', holds no empty value ('' was one more genre the
    ranker's features counted)."""
    lists = pc.split_pattern(column, "|")
    values, parents = pc.list_flatten(lists), pc.list_parent_indices(lists)
    keep = pc.not_equal(values, "")
    counts = np.bincount(parents.filter(keep).to_numpy(), minlength=len(lists))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, values.filter(keep), mask=lists.is_null())


def _read_items(path: Path, item_col: str, sep: str) -> pa.Table:
    table = _read_columns(path, None, sep)
    if item_col not in table.column_names:
        raise DataError(path, f"no column {item_col!r} (columns: {', '.join(table.column_names)})",
                        line=None if _is_parquet(path) else 1)
    reserved = [name for name in table.column_names if name in RESERVED_ITEM_COLUMNS and name != item_col]
    if reserved:
        raise DataError(path, f"column {reserved[0]!r} is a name seqrec prepare keeps for its own items.parquet "
                        f"columns ({', '.join(RESERVED_ITEM_COLUMNS)}); rename it",
                        line=None if _is_parquet(path) else 1)
    columns = {"item_id": _as_string(table.column(item_col).combine_chunks(), path, item_col, sep)}
    check_unique(columns["item_id"], path, "item_id", header=None if _is_parquet(path) else True,
                 quoted=_quoted(sep), sep=sep)
    for name in table.column_names:
        if name == item_col:
            continue
        column = table.column(name).combine_chunks()
        if name in ("genres", "attributes") and pa.types.is_string(column.type):
            column = _value_lists(column)
        columns[name] = column
    return pa.table(columns)
