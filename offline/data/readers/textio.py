"""Fast reading of delimited text files, with errors that name the file and line.

The fast path is pyarrow's multithreaded CSV reader. pyarrow's own errors do not
always say which line broke (it reads blocks in parallel), so when it fails we find
the first record it rejects by bisection, parsing halves with pyarrow itself (Python's
int() and float() accept what pyarrow refuses), and report that record's first line.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from offline.data.errors import DataError

# pyarrow accepts one-character delimiters only; MovieLens 1M/10M use "::".
_UNIT_SEPARATOR = "\x1f"
_BOM = b"\xef\xbb\xbf"
_SHOWN_CHARS = 80
_WHOLE_NUMBER = re.compile(r"\s*[-+]?\d+\s*$")


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
    first = read_bytes(path).removeprefix(_BOM).split(b"\n", 1)[0].rstrip(b"\r")
    try:
        text = first.decode(encoding)
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
    trimmed: Sequence[str] = (),
) -> pa.Table:
    """Read a delimited file into an Arrow table.

    names: the column names of a file without a header (every field must be named).
    header: the first line holds the names (then ``names`` must be None).
    types: Arrow types for some columns; the rest stay strings. Empty fields in typed
        columns are errors, never silent nulls.
    columns: keep only these columns (a missing one is an error naming the file).
    quoted: fields may be quoted ("a, b"), as in MovieLens 20M's movies.csv; a quoted
        field may hold line breaks, and then line numbers count the lines of the file.
    non_empty: string columns where an empty field is an error (ids), named with its line.
    trimmed: string columns whose fields lose surrounding whitespace (Arrow trims typed
        columns only), before the ``non_empty`` check.
    A UTF-8 byte order mark at the start is dropped, whatever the encoding.
    """
    path = Path(path)
    if (names is None) == (not header):
        raise ValueError("give names for a file without a header, or header=True")
    data = read_bytes(path)
    field_names = list(names) if names is not None else header_fields(path, sep=sep, encoding=encoding, quoted=quoted)
    keep = list(columns) if columns is not None else field_names
    layout = _Layout(sep, field_names, keep, dict(types or {}), quoted, encoding)
    _check_columns(path, field_names, [*keep, *layout.types, *non_empty, *trimmed], sep=sep, header=header)
    text = _as_utf8(data, encoding, sep)
    end = _EndMarker(len(field_names), layout.arrow_sep) if quoted else None
    try:
        table = _parse(text + end.record(text) if end else text, layout, skip_rows=1 if header else 0, end=end)
    except (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowTypeError) as err:
        line, reason = _first_bad_line(data, text, layout, header)
        if line is None:
            raise DataError(path, f"cannot parse: {_cut(one_line(err), 200)}") from None
        raise DataError(path, reason, line=line) from None
    if end is not None and not end.seen:  # a quote left open ran to the end of the file, marker and all
        raise DataError(path, "unclosed quote: the field runs to the end of the file",
                        line=_unclosed_quote_line(data, layout, header))
    if table.num_rows == 0:
        raise DataError(path, "no data rows")
    for name in trimmed:
        table = table.set_column(table.column_names.index(name), name, pc.utf8_trim_whitespace(table.column(name)))
    _check_non_empty(path, table, non_empty, header=header, quoted=quoted, sep=sep)
    return table


@dataclass(frozen=True)
class _Layout:
    """How to read a file's fields: what `read_delimited` was asked."""

    sep: str
    names: list[str]
    keep: list[str]
    types: dict[str, pa.DataType]
    quoted: bool
    encoding: str

    @property
    def arrow_sep(self) -> str:
        return self.sep if len(self.sep) == 1 else _UNIT_SEPARATOR


class _EndMarker:
    """A record appended to quoted text, one field too many, that Arrow hands to `invalid_row_handler` and we drop.
    If it never arrives, an open quote swallowed it (and every line before it since the quote opened): Arrow
    reads that without complaint."""

    _TEXT = "\x00seqrec: end of file"

    def __init__(self, n_fields: int, sep: str) -> None:
        self.line = sep * n_fields + self._TEXT
        self.seen = False

    def record(self, text: bytes) -> bytes:
        return (b"" if text.endswith(b"\n") else b"\n") + self.line.encode() + b"\n"

    def __call__(self, row: pacsv.InvalidRow) -> str:
        if row.text == self.line and not self.seen:
            self.seen = True
            return "skip"
        return "error"


def _parse(text: bytes, layout: _Layout, *, skip_rows: int, end: _EndMarker | None = None,
           keep: Sequence[str] | None = None, types: Mapping[str, pa.DataType] | None = None) -> pa.Table:
    """Arrow's read of UTF-8 text (see `_as_utf8`); ``keep`` and ``types`` default to the layout's."""
    keep = layout.keep if keep is None else keep
    types = layout.types if types is None else types
    return pacsv.read_csv(
        io.BytesIO(text),
        read_options=pacsv.ReadOptions(column_names=layout.names, skip_rows=skip_rows),
        parse_options=pacsv.ParseOptions(delimiter=layout.arrow_sep, quote_char='"' if layout.quoted else False,
                                         newlines_in_values=layout.quoted, invalid_row_handler=end),
        convert_options=pacsv.ConvertOptions(
            column_types={name: types.get(name, pa.string()) for name in keep},
            include_columns=keep,
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )


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
    """The bytes Arrow reads: UTF-8 without a byte order mark, with a multi-character separator replaced by one
    character. The lines stay where they were."""
    text = data.removeprefix(_BOM)  # a BOM decoded as Latin-1 would be 'ï»¿', glued to the first id
    if encoding.lower().replace("_", "-") not in ("utf-8", "ascii"):
        # Latin-1 and friends decode any byte string; Arrow wants UTF-8.
        text = text.decode(encoding).encode("utf-8")
    if len(sep) > 1:
        text = text.replace(sep.encode("utf-8"), _UNIT_SEPARATOR.encode())
    return text


def _check_non_empty(path: Path, table: pa.Table, non_empty: Sequence[str], *, header: bool, quoted: bool,
                     sep: str) -> None:
    """An empty field in an id column is an error naming its line, not an empty id."""
    for name in non_empty:
        empty = pc.equal(table.column(name), "").combine_chunks()
        if pc.any(empty).as_py():
            row = int(pc.index(empty, True).as_py())
            line = row_line(path, row, header=header, quoted=quoted, sep=sep)
            raise DataError(path, f"column {name!r} is empty", line=line)


def row_line(path: str | Path, row: int, *, header: bool, quoted: bool = False, sep: str = ",") -> int:
    """The line number of data row ``row`` (0-based) of a delimited file: blank lines hold no row (as for
    pyarrow's reader), a header line comes first, and with ``quoted`` (fields separated by ``sep``) a row runs on
    while a quoted field is open. For error messages only: it reads the file again."""
    path = Path(path)
    spans = _record_spans(read_bytes(path), sep, quoted=quoted, header=header)[0]
    if row >= len(spans):
        raise ValueError(f"{path} has no data row {row}")
    return spans[row][0]


def check_unique(values: pa.Array | pa.ChunkedArray, path: str | Path, what: str, *, header: bool | None,
                 quoted: bool = False, sep: str = ",") -> None:
    """A key column (an item or user id of a metadata file) must not repeat: a DataError naming the second
    line and the first. ``header`` None: the file has no lines (Parquet), so rows are named instead."""
    if len(pc.unique(values)) == len(values):
        return
    first: dict[object, int] = {}
    for row, value in enumerate(values.to_pylist()):
        if value in first:
            shown = shown_value(value) if isinstance(value, str) else repr(value)
            if header is None:
                raise DataError(path, f"{what} {shown} appears again in row {row + 1} (first in row "
                                f"{first[value] + 1})")
            first_line = row_line(path, first[value], header=header, quoted=quoted, sep=sep)
            raise DataError(path, f"{what} {shown} appears again (first on line {first_line})",
                            line=row_line(path, row, header=header, quoted=quoted, sep=sep))
        first[value] = row


def one_line(err: BaseException) -> str:
    """An exception's message on one line (pyarrow's span several): errors are one line on stderr."""
    return " ".join(str(err).split())


def shown_value(value: str) -> str:
    """A field as an error message quotes it: repr, cut after 80 characters (a 2 MB field, a 2 MB line)."""
    return repr(value) if len(value) <= _SHOWN_CHARS else f"{value[:_SHOWN_CHARS]!r}…"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…"


def _shown(sep: str) -> str:
    return sep.encode("unicode_escape").decode()


def _split(text: str, sep: str, quoted: bool) -> list[str]:
    if quoted:
        return next(csv.reader([text], delimiter=sep))
    return text.split(sep)


def _record_spans(data: bytes, sep: str, *, quoted: bool, header: bool) -> tuple[list[tuple[int, int]], int | None]:
    """The data records as (first, last) line numbers (1-based): blank lines and the header line hold none. With
    ``quoted``, a record runs on while a quoted field is open, as in Arrow's ``newlines_in_values``. Second: the
    first line of a record whose quote never closes, else None."""
    spans: list[tuple[int, int]] = []
    start, open_quote = 0, False
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if header and number == 1:
            continue
        if not open_quote:
            if not raw.rstrip(b"\r"):
                continue
            start = number
        if quoted:
            open_quote = _ends_in_quote(raw, sep.encode(), open_quote)
        if not open_quote:
            spans.append((start, number))
    return spans, start if open_quote else None


def _ends_in_quote(line: bytes, sep: bytes, open_quote: bool) -> bool:
    """Whether a quoted field is open at the end of ``line``, given whether one was at its start. As Arrow reads:
    a quote opens a field only at its start, "" inside one is a quote, text after the closing quote is literal."""
    if not open_quote and b'"' not in line:
        return False
    pos = 0
    while True:
        if open_quote:
            quote = line.find(b'"', pos)
            if quote < 0:
                return True
            if line.startswith(b'"', quote + 1):
                pos = quote + 2
                continue
            open_quote, pos = False, quote + 1
        elif line.startswith(b'"', pos):
            open_quote, pos = True, pos + 1
            continue
        next_sep = line.find(sep, pos)
        if next_sep < 0:
            return False
        pos = next_sep + len(sep)


def _unclosed_quote_line(data: bytes, layout: _Layout, header: bool) -> int | None:
    return _record_spans(data, layout.sep, quoted=layout.quoted, header=header)[1]


def _first_bad_line(data: bytes, text: bytes, layout: _Layout, header: bool) -> tuple[int | None, str]:
    """The first record Arrow rejects, found by bisection with Arrow itself, so that Python's looser parsing
    (int('1_0'), 10**20) never disagrees; (None, "") if Arrow reads every record alone.
    data: the file's bytes; text: what Arrow read (`_as_utf8`), line for line the same."""
    spans, unclosed = _record_spans(data, layout.sep, quoted=layout.quoted, header=header)
    if unclosed is not None:
        spans.append((unclosed, data.count(b"\n") + 1))
    lines = text.split(b"\n")

    def chunk(first: int, stop: int) -> bytes:  # records first..stop-1
        return b"\n".join(lines[spans[first][0] - 1:spans[stop - 1][1]]) + b"\n"

    def fails(first: int, stop: int) -> bool:
        try:
            _parse(chunk(first, stop), layout, skip_rows=0)
        except (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowTypeError):
            return True
        return False

    good, bad = 0, len(spans)  # records before `good` parse; records good..bad-1 do not
    if not spans or not fails(good, bad):
        return None, ""
    while bad - good > 1:
        middle = (good + bad) // 2
        if fails(good, middle):
            bad = middle
        else:
            good = middle
    first, last = spans[good]
    record = b"\n".join(data.split(b"\n")[first - 1:last])
    return first, _why_bad(record, chunk(good, good + 1), layout)


def _why_bad(record: bytes, text: bytes, layout: _Layout) -> str:
    """Why Arrow rejects one record; ``text`` is what Arrow read of it."""
    try:
        line = record.decode(layout.encoding).replace("\r\n", "\n").removesuffix("\r")
    except UnicodeDecodeError as err:
        return f"not valid {layout.encoding} text (byte {err.start} of the line)"
    try:
        fields = _split(line, layout.sep, layout.quoted)
    except csv.Error as err:
        return f"malformed quoting: {err}"
    if len(fields) != len(layout.names):
        if layout.quoted and _ends_in_quote(record, layout.sep.encode(), False):
            return "unclosed quote"
        return f"expected {len(layout.names)} fields separated by '{_shown(layout.sep)}', found {len(fields)}"
    for name, dtype in layout.types.items():
        if name not in layout.keep:
            continue
        try:
            _parse(text, layout, skip_rows=0, keep=[name], types={name: dtype})
        except pa.ArrowInvalid:
            return _not_a(name, fields[layout.names.index(name)], dtype)
    try:
        _parse(text, layout, skip_rows=0)
    except (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowTypeError) as err:
        return f"cannot parse: {_cut(one_line(err), 200)}"
    return "cannot parse"


def _not_a(name: str, value: str, dtype: pa.DataType) -> str:
    if pa.types.is_integer(dtype):
        if _WHOLE_NUMBER.match(value):
            return f"column {name!r}: {shown_value(value)} is out of range for {dtype}"
        return f"column {name!r}: {shown_value(value)} is not an int"
    if pa.types.is_floating(dtype):
        return f"column {name!r}: {shown_value(value)} is not a float"
    return f"column {name!r}: {shown_value(value)} is not a {dtype}"
