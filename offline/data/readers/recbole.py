"""RecBole atomic files: ``<name>.inter`` plus optional ``<name>.item`` and ``<name>.user``.

Each file is tab-separated, UTF-8, with a ``field:type`` header; the types are
``token``, ``token_seq`` (space-separated tokens), ``float`` and ``float_seq``.
See https://recbole.io/docs/user_guide/data/atomic_files.html.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offline.data.errors import DataError
from offline.data.readers.base import ITEM, TIME, USER, RawDataset, int_if_integral
from offline.data.readers.textio import check_unique, header_fields, read_delimited, row_line, shown_value

_TYPES = ("token", "token_seq", "float", "float_seq")
RATING = "rating"

# (values, file, header field) -> column; the file and field name the errors.
Converter = Callable[[list[str], Path, str], pa.Array]


def read_recbole(path: str | Path, name: str | None = None) -> RawDataset:
    """Read the atomic files of one dataset from a folder.

    name: the files' stem (``ml-100k`` for ``ml-100k.inter``); None takes the single
        ``*.inter`` file in the folder.
    The interactions keep the file's row order. ``timestamp`` becomes int64 when every
    value is a whole number (RecBole declares it float; read exactly, not through a
    float), else float64; NaN and infinities are errors. Without a timestamp field it
    holds each row's position in the file and ``has_timestamps`` is False.
    """
    folder = Path(path)
    inter_path = _inter_path(folder, name)
    stem = inter_path.name.removesuffix(".inter")
    interactions, has_timestamps = _read_interactions(inter_path)
    files = [inter_path]
    tables: dict[str, pa.Table | None] = {}
    for suffix, key, known in (("item", ITEM, _ITEM_FIELDS), ("user", USER, {})):
        meta_path = folder / f"{stem}.{suffix}"
        tables[suffix] = _read_metadata(meta_path, key, known) if meta_path.exists() else None
        if meta_path.exists():
            files.append(meta_path)
    return RawDataset(
        source="recbole",
        interactions=interactions,
        items=tables["item"],
        users=tables["user"],
        has_timestamps=has_timestamps,
        files=files,
    )


def _inter_path(folder: Path, name: str | None) -> Path:
    if not folder.is_dir():
        raise DataError(folder, "no such folder")
    if name is not None:
        return folder / f"{name}.inter"
    found = sorted(folder.glob("*.inter"))
    if len(found) != 1:
        listed = ", ".join(p.name for p in found) or "none"
        raise DataError(folder, f"expected exactly one *.inter file, found {listed}; pass the dataset name")
    return found[0]


def _fields(path: Path) -> dict[str, tuple[str, str]]:
    """Header ``name:type`` fields as name -> (header text, type), in file order."""
    fields: dict[str, tuple[str, str]] = {}
    texts = header_fields(path, sep="\t")
    if len(texts) == 1 and any(sep in texts[0] for sep in (",", ";", " ", "|")):
        raise DataError(path, f"one header field {texts[0]!r}: fields are separated by tabs", line=1)
    for text in texts:
        name, _, kind = text.rpartition(":")
        if not name or kind not in _TYPES:
            raise DataError(path, f"header field {text!r} is not name:type with a type in {_TYPES}", line=1)
        if name in fields:
            raise DataError(path, f"field {name!r} appears twice in the header", line=1)
        fields[name] = (text, kind)
    return fields


def _read_interactions(path: Path) -> tuple[pa.Table, bool]:
    fields = _fields(path)
    for key in (USER, ITEM):
        if key not in fields:
            raise DataError(path, f"no {key!r} field in the header (fields: {', '.join(fields)})", line=1)
    wanted = [name for name in (USER, ITEM, TIME, RATING) if name in fields]
    numeric = {fields[RATING][0]: pa.float64()} if RATING in fields else {}
    table = read_delimited(path, sep="\t", header=True, types=numeric, columns=[fields[n][0] for n in wanted],
                           non_empty=[fields[USER][0], fields[ITEM][0]])
    table = table.rename_columns(wanted)
    if RATING in fields:
        _check_finite(table[RATING], path, fields[RATING][0], "ratings")
    if TIME in fields:
        table = table.set_column(wanted.index(TIME), TIME, _timestamps(table[TIME], path, fields[TIME][0]))
    else:
        positions = pa.array(np.arange(table.num_rows, dtype=np.int64))
        table = table.add_column(2, TIME, positions)
    return table, TIME in fields


def _timestamps(text: pa.ChunkedArray, path: Path, field: str) -> pa.Array:
    """int64 when every value is a whole number ("1600000000000000003", "978300760.0"), exactly: through float64
    such values past 2**53 would round, and ties rewrite the order. Else finite float64."""
    text = pc.utf8_trim_whitespace(text.combine_chunks())
    for whole in (text, pc.replace_substring_regex(text, r"\.0*$", "")):
        try:
            return whole.cast(pa.int64())
        except pa.ArrowInvalid:
            continue
    try:
        numbers = text.cast(pa.float64())
    except pa.ArrowInvalid:
        row = _first_failing_cast(text, pa.float64())
        raise DataError(path, f"column {field!r}: {shown_value(text[row].as_py())} is not a float",
                        line=row_line(path, row, header=True)) from None
    _check_finite(numbers, path, field, "timestamps")
    return int_if_integral(numbers)


def _first_failing_cast(values: pa.Array, dtype: pa.DataType) -> int:
    """The first value that does not cast, by bisection (Arrow's cast says which value, not where)."""
    good, bad = 0, len(values)  # values[good:bad] holds the first failure
    while bad - good > 1:
        middle = (good + bad) // 2
        try:
            values.slice(good, middle - good).cast(dtype)
        except pa.ArrowInvalid:
            bad = middle
        else:
            good = middle
    return good


def _check_finite(values: pa.Array | pa.ChunkedArray, path: Path, field: str, what: str) -> None:
    finite = np.isfinite(values.to_numpy())
    if not finite.all():
        row = int(np.argmin(finite))
        raise DataError(path, f"column {field!r} holds non-finite {what} ({values[row].as_py()})",
                        line=row_line(path, row, header=True))


def _read_metadata(path: Path, key: str, known: dict[str, tuple[str, Converter]]) -> pa.Table:
    """An .item or .user file; ``known`` maps field names to a column name and converter."""
    fields = _fields(path)
    if key not in fields:
        raise DataError(path, f"no {key!r} field in the header (fields: {', '.join(fields)})", line=1)
    table = read_delimited(path, sep="\t", header=True)
    check_unique(table[fields[key][0]], path, key, header=True)
    columns: dict[str, pa.Array] = {}
    for name, (text, kind) in fields.items():
        column, convert = known.get(name, (name, _BY_TYPE[kind]))
        if name == key:
            column, convert = key, _as_text
        if column in columns:
            raise DataError(path, f"two header fields map to the column {column!r}", line=1)
        columns[column] = convert(table[text].to_pylist(), path, text)
    return pa.table(columns)


def _as_text(values: list[str], path: Path, field: str) -> pa.Array:
    return pa.array(values, pa.string())


def _as_tokens(values: list[str], path: Path, field: str) -> pa.Array:
    return pa.array([value.split() for value in values], pa.list_(pa.string()))


def _as_year(values: list[str], path: Path, field: str) -> pa.Array:
    """Whole numbers, null for anything else (ml-100k has 'unkonwn' and 'V')."""
    years: list[int | None] = []
    for value in values:
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        years.append(int(number) if number.is_integer() else None)
    return pa.array(years, pa.int32())


def _as_float(values: list[str], path: Path, field: str) -> pa.Array:
    return pa.array([_float(value, index, path, field) for index, value in enumerate(values)], pa.float64())


def _as_floats(values: list[str], path: Path, field: str) -> pa.Array:
    lists = [[_float(part, index, path, field) for part in value.split()] for index, value in enumerate(values)]
    return pa.array(lists, pa.list_(pa.float64()))


def _float(value: str, index: int, path: Path, field: str) -> float | None:
    if not value.strip():
        return None
    try:
        return float(value)
    except ValueError:
        raise DataError(path, f"column {field!r}: {shown_value(value)} is not a float",
                        line=row_line(path, index, header=True)) from None


_BY_TYPE: dict[str, Converter] = {
    "token": _as_text,
    "token_seq": _as_tokens,
    "float": _as_float,
    "float_seq": _as_floats,
}

_ITEM_FIELDS: dict[str, tuple[str, Converter]] = {
    "movie_title": ("title", _as_text),
    "title": ("title", _as_text),
    "release_year": ("year", _as_year),
    "class": ("genres", _as_tokens),
    "genre": ("genres", _as_tokens),
    "genres": ("genres", _as_tokens),
}
