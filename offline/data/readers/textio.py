"""Fast reading of delimited text files, with errors that name the file and line.

The fast path is pyarrow's multithreaded CSV reader. pyarrow's own errors do not
always say which line broke (it reads blocks in parallel), so when it fails we scan
the file once in plain Python to find the first bad line and report that.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from offline.data.errors import DataError

# pyarrow accepts one-character delimiters only; MovieLens 1M/10M use "::".
_UNIT_SEPARATOR = "\x1f"


def read_bytes(path: str | Path) -> bytes:
    path = Path(path)
    if not path.exists():
        raise DataError(path, "no such file")
    if not path.is_file():
        raise DataError(path, "not a file")
    data = path.read_bytes()
    if not data.strip():
        raise DataError(path, "file is empty")
    return data


def header_fields(path: str | Path, *, sep: str, encoding: str = "utf-8", quoted: bool = False) -> list[str]:
    """The names on the first line of a file with a header."""
    first = read_bytes(path).split(b"\n", 1)[0].rstrip(b"\r")
    try:
        text = first.decode(encoding).lstrip("\ufeff")
    except UnicodeDecodeError as err:
        raise DataError(path, f"header is not valid {encoding} text (byte {err.start})", line=1) from None
    return _split(text, sep, quoted)


def read_delimited(
    path: str | Path,
    *,
    sep: str,
    names: Sequence[str] | None = None,
    types: Mapping[str, pa.DataType] | None = None,
    header: bool = False,
    encoding: str = "utf-8",
    quoted: bool = False,
    columns: Sequence[str] | None = None,
    non_empty: Sequence[str] = (),
) -> pa.Table:
    """Read a delimited file into an Arrow table.

    names: the column names of a file without a header (every field must be named).
    header: the first line holds the names (then ``names`` must be None).
    types: Arrow types for some columns; the rest stay strings. Empty fields in typed
        columns are errors, never silent nulls.
    columns: keep only these columns (a missing one is an error naming the file).
    quoted: fields may be quoted ("a, b"), as in MovieLens 20M's movies.csv.
    non_empty: string columns where an empty field is an error (ids), named with its line.
    """
    path = Path(path)
    if (names is None) == (not header):
        raise ValueError("give names for a file without a header, or header=True")
    data = read_bytes(path)
    field_names = list(names) if names is not None else header_fields(path, sep=sep, encoding=encoding, quoted=quoted)
    types = dict(types or {})
    keep = list(columns) if columns is not None else field_names
    _check_columns(path, field_names, [*keep, *types, *non_empty], sep=sep, header=header)
    try:
        table = pacsv.read_csv(
            io.BytesIO(_as_utf8(data, encoding, sep)),
            read_options=pacsv.ReadOptions(column_names=field_names, skip_rows=1 if header else 0),
            parse_options=pacsv.ParseOptions(delimiter=sep if len(sep) == 1 else _UNIT_SEPARATOR,
                                             quote_char='"' if quoted else False),
            convert_options=pacsv.ConvertOptions(
                column_types={name: types.get(name, pa.string()) for name in keep},
                include_columns=keep,
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowTypeError) as err:
        line, reason = _first_bad_line(data, sep, field_names, types, header, encoding, quoted)
        if line is None:
            raise DataError(path, f"cannot parse: {one_line(err)}") from None
        raise DataError(path, reason, line=line) from None
    if table.num_rows == 0:
        raise DataError(path, "no data rows")
    _check_non_empty(path, table, non_empty, header=header)
    return table


def _check_columns(path: Path, field_names: list[str], wanted: Sequence[str], *, sep: str, header: bool) -> None:
    """Every wanted column is one of the file's, and only once; a header read as one column hints at the
    separator."""
    unknown = [c for c in wanted if c not in field_names]
    if unknown:
        listed, hint = ", ".join(field_names), ""
        if header and len(field_names) == 1:
            listed, hint = _shown(field_names[0]), f"; one column only: is '{_shown(sep)}' the separator?"
        raise DataError(path, f"no column {unknown[0]!r} (columns: {listed}){hint}", line=1 if header else None)
    repeated = [c for c in wanted if field_names.count(c) > 1]
    if repeated:
        raise DataError(path, f"column {repeated[0]!r} appears {field_names.count(repeated[0])} times in the header; "
                        "rename all but one", line=1 if header else None)


def _as_utf8(data: bytes, encoding: str, sep: str) -> bytes:
    """The bytes Arrow reads: UTF-8, with a multi-character separator replaced by one character."""
    text = data
    if encoding.lower().replace("_", "-") not in ("utf-8", "ascii"):
        # Latin-1 and friends decode any byte string; Arrow wants UTF-8.
        text = data.decode(encoding).encode("utf-8")
    if len(sep) > 1:
        text = text.replace(sep.encode("utf-8"), _UNIT_SEPARATOR.encode())
    return text


def _check_non_empty(path: Path, table: pa.Table, non_empty: Sequence[str], *, header: bool) -> None:
    """An empty field in an id column is an error naming its line, not an empty id."""
    for name in non_empty:
        empty = pc.equal(table.column(name), "").combine_chunks()
        if pc.any(empty).as_py():
            row = int(pc.index(empty, True).as_py())
            raise DataError(path, f"column {name!r} is empty", line=row_line(path, row, header=header))


def row_line(path: str | Path, row: int, *, header: bool) -> int:
    """The line number of data row ``row`` (0-based) of a delimited file: blank lines hold no row (as for
    pyarrow's reader), a header line comes first. For error messages only: it reads the file again."""
    lines = read_bytes(path).split(b"\n")
    seen = -1
    for number, raw in enumerate(lines[1:] if header else lines, start=2 if header else 1):
        if raw.rstrip(b"\r"):
            seen += 1
            if seen == row:
                return number
    raise ValueError(f"{path} has no data row {row}")


def check_unique(values: pa.Array | pa.ChunkedArray, path: str | Path, what: str, *, header: bool | None) -> None:
    """A key column (an item or user id of a metadata file) must not repeat: a DataError naming the second
    line and the first. ``header`` None: the file has no lines (Parquet), so rows are named instead."""
    if len(pc.unique(values)) == len(values):
        return
    first: dict[object, int] = {}
    for row, value in enumerate(values.to_pylist()):
        if value in first:
            if header is None:
                raise DataError(path, f"{what} {value!r} appears again in row {row + 1} (first in row "
                                f"{first[value] + 1})")
            raise DataError(path, f"{what} {value!r} appears again (first on line "
                            f"{row_line(path, first[value], header=header)})", line=row_line(path, row, header=header))
        first[value] = row


def one_line(err: BaseException) -> str:
    """An exception's message on one line (pyarrow's span several): errors are one line on stderr."""
    return " ".join(str(err).split())


def _shown(sep: str) -> str:
    return sep.encode("unicode_escape").decode()


def _split(text: str, sep: str, quoted: bool) -> list[str]:
    if quoted:
        return next(csv.reader([text], delimiter=sep))
    return text.split(sep)


_PARSERS = {"int": int, "float": float}


def _first_bad_line(
    data: bytes,
    sep: str,
    names: Sequence[str],
    types: Mapping[str, pa.DataType],
    header: bool,
    encoding: str,
    quoted: bool,
) -> tuple[int | None, str]:
    """Scan line by line for the first line Arrow would reject; (None, "") if none."""
    checks = []
    for name, dtype in types.items():
        kind = "int" if pa.types.is_integer(dtype) else "float" if pa.types.is_floating(dtype) else None
        if kind is not None:
            checks.append((names.index(name), name, kind))
    shown_sep = _shown(sep)
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if header and number == 1:
            continue
        raw = raw.rstrip(b"\r")
        if not raw:
            continue
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as err:
            return number, f"not valid {encoding} text (byte {err.start} of the line)"
        try:
            fields = _split(text, sep, quoted)
        except csv.Error as err:
            return number, f"malformed quoting: {err}"
        if len(fields) != len(names):
            if quoted and text.count('"') % 2:  # quotes inside a field are doubled, so they come in pairs
                return number, "unclosed quote"
            return number, f"expected {len(names)} fields separated by '{shown_sep}', found {len(fields)}"
        for index, name, kind in checks:
            try:
                _PARSERS[kind](fields[index])
            except ValueError:
                article = "an" if kind == "int" else "a"
                return number, f"column {name!r}: {fields[index]!r} is not {article} {kind}"
    return None, ""
