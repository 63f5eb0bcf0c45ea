"""S3-Rec / SASRec line format: ``user item item ...`` per line, items in time order.

Used by the Amazon datasets of S3-Rec, ICLRec and SASRec (e.g. ``Beauty.txt``), with an
optional ``<Name>_item2attributes.json`` mapping item id -> list of attribute ids.
The files carry no clock, so each interaction's timestamp is its position in the line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from offline.data.errors import DataError
from offline.data.readers.base import RawDataset, natural_key
from offline.data.readers.textio import read_bytes

log = logging.getLogger(__name__)

_BOM = b"\xef\xbb\xbf"  # some editors start UTF-8 files with one; it is no part of the first user id


def find_s3rec_files(path: str | Path) -> tuple[Path, Path | None]:
    """The sequences file and its attributes file (None if absent) for a file or folder."""
    path = Path(path)
    if path.is_dir():
        candidates = sorted(p for p in path.glob("*.txt") if not p.stem.endswith("_user_item"))
        if len(candidates) != 1:
            names = ", ".join(p.name for p in candidates) or "none"
            raise DataError(path, f"expected one '<Name>.txt' sequences file, found {names}; pass the file itself")
        path = candidates[0]
    attributes = path.with_name(f"{path.stem}_item2attributes.json")
    return path, attributes if attributes.is_file() else None


def read_s3rec(path: str | Path) -> RawDataset:
    """Read ``<Name>.txt`` (a file, or a folder holding one) and its attributes if present."""
    sequences_path, attributes_path = find_s3rec_files(path)
    users, items, positions = _read_lines(sequences_path)
    interactions = pa.table(
        {
            "user_id": pa.array(users, pa.string()),
            "item_id": pa.array(items, pa.string()),
            "timestamp": pa.array(positions, pa.int64()),
        }
    )
    files = [sequences_path]
    item_table = None
    if attributes_path is not None:
        item_table = _read_attributes(attributes_path, sorted(set(items), key=natural_key))
        files.append(attributes_path)
    return RawDataset(
        source="s3rec", interactions=interactions, items=item_table, has_timestamps=False, files=files
    )


def _read_lines(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    users: list[str] = []
    items: list[str] = []
    lengths: list[int] = []
    first_line: dict[str, int] = {}
    # splitlines: "\r" alone ends a line too, or a file with old Mac line ends would be one user.
    for number, raw in enumerate(read_bytes(path).removeprefix(_BOM).splitlines(), start=1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            fields = raw.decode("utf-8").split()
        except UnicodeDecodeError as err:
            raise DataError(path, f"not valid utf-8 text (byte {err.start} of the line)", line=number) from None
        if len(fields) < 2 and not any(sep in fields[0] for sep in _JOINERS):
            raise DataError(path, "expected 'user item [item ...]', found a user with no items", line=number)
        joined = next((field for field in fields if any(sep in field for sep in _JOINERS)), None)
        if joined is not None:  # it was one item, '10,20,30', and its user likely dropped as too short
            raise DataError(path, f"expected 'user item [item ...]' separated by spaces, found {joined[:60]!r}",
                            line=number)
        user = fields[0]
        if user in first_line:
            raise DataError(path, f"user {user!r} appears again (first on line {first_line[user]})", line=number)
        first_line[user] = number
        users.extend([user] * (len(fields) - 1))
        items.extend(fields[1:])
        lengths.append(len(fields) - 1)
    starts = np.repeat(np.cumsum([0, *lengths[:-1]]), lengths)
    positions = np.arange(len(items), dtype=np.int64) - starts
    return users, items, positions


def _read_attributes(path: Path, item_ids: list[str]) -> pa.Table:
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        raise DataError(path, f"not valid utf-8 text (byte {err.start - line_start} of the line)",
                        line=data.count(b"\n", 0, err.start) + 1) from None
    try:
        mapping = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise DataError(path, f"not valid JSON: {err.msg} (column {err.colno})", line=err.lineno) from None
    except _RepeatedKey as err:
        raise DataError(path, f"item {err.args[0]!r} appears twice") from None
    if not isinstance(mapping, dict):
        raise DataError(path, "expected a JSON object mapping item id -> list of attribute ids")
    attributes = []
    for item in item_ids:
        values = mapping.get(item, [])
        if not isinstance(values, list):
            raise DataError(path, f"item {item!r}: expected a list of attribute ids, found {type(values).__name__}")
        odd = next((v for v in values if isinstance(v, bool) or not isinstance(v, int | str)), _NONE)
        if odd is not _NONE:  # str() made '[2, 3]', 'True' or 'None' an attribute
            raise DataError(path, f"item {item!r}: attribute ids are integers or strings, found "
                            f"{type(odd).__name__} {json.dumps(odd)[:40]}")
        attributes.append([str(v) for v in values])
    missing = sum(item not in mapping for item in item_ids)
    unknown = len(set(mapping) - set(item_ids))
    if missing or unknown:
        log.warning("%s: %d of %d items have no entry (their attributes are empty); %d entries name no item of the "
                    "interactions", path, missing, len(item_ids), unknown)
    return pa.table(
        {"item_id": pa.array(item_ids, pa.string()), "attributes": pa.array(attributes, pa.list_(pa.string()))}
    )


_JOINERS = (",", ";", "|")  # separators that would make one token of several items
_NONE = object()


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all distinct (json keeps the last of repeated keys, silently)."""
    mapping: dict[str, object] = {}
    for key, value in pairs:
        if key in mapping:
            raise _RepeatedKey(key)
        mapping[key] = value
    return mapping
