"""The catalogue journal on disk: where it lives, its append-only format, its lock, and the previous format.

Where: beside the versions, not inside one. A bundle published as ``ARTIFACTS/versions/<id>`` reads
``ARTIFACTS/catalogue_changes.jsonl``, whichever version ``current`` names, so pointing ``current`` back at an
older version (``seqrec rollback``) keeps retired items retired and added items added. A bundle served from any
other folder keeps its journal in that folder.

Format: JSON lines. The first is a header (``{"format": "seqrec.catalogue-changes/2"}``), each next one a change
(``{"added": [rows]}`` or ``{"retired": [ids]}``). A change is one ``write`` of one line at the end of the file
(``O_APPEND``), fsynced before it is acknowledged, so it costs the same at 10 and 100,000 journalled items, and a
reader that has read the first N bytes reads only what follows them (`read_since`). A line cut short by a
``kill -9`` during its write was never acknowledged: readers skip it and the next change truncates it away.

The previous format (``BUNDLE/catalogue_changes.json``, one JSON document rewritten whole, inside each version)
still loads: while no journal exists beside the versions, the served bundle's own file is its journal; the first
change copies it beside the versions (one header and one line of its changes) and appends from there.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.atomic import atomic_write, sync

JOURNAL = "catalogue_changes.jsonl"
LEGACY_JOURNAL = "catalogue_changes.json"  # the previous format, inside a bundle
LOCK = ".catalogue_changes.lock"
FORMAT = "seqrec.catalogue-changes/2"
LEGACY_FORMAT = "seqrec.catalogue-changes/1"
VERSIONS = "versions"  # offline.jobs.versions.VERSIONS: where `seqrec pipeline` publishes bundles

Record = dict[str, Any]  # one change: {"added": [rows]} and/or {"retired": [ids]}
Position = tuple[int, int]  # (inode, bytes read) of the journal file


class JournalError(ValueError):
    """A journal that cannot be read (the message names the file and the line)."""


def journal_home(bundle_path: Path) -> Path:
    """The folder whose journal applies to ``bundle_path``: ARTIFACTS for ARTIFACTS/versions/<id>, else the bundle."""
    resolved = bundle_path.resolve()
    return resolved.parent.parent if resolved.parent.name == VERSIONS else resolved


def journal_file(bundle_path: Path) -> Path:
    return journal_home(bundle_path) / JOURNAL


def read_records(bundle_path: Path) -> tuple[list[Record], Position | None]:
    """Every change that applies to ``bundle_path``, in order, and the position read up to (None: the previous
    format's file or no journal at all, read whole next time too)."""
    file = journal_file(bundle_path)
    try:
        with file.open("rb") as handle:
            return _parse(handle.read(), file, 0), (os.fstat(handle.fileno()).st_ino, _complete(handle))
    except FileNotFoundError:
        return _legacy(bundle_path), None


def read_since(bundle_path: Path, position: Position) -> tuple[list[Record], Position] | None:
    """The changes appended after ``position``; None when the file is no longer the one read (replaced, or
    shorter: read it whole again)."""
    file = journal_file(bundle_path)
    inode, offset = position
    try:
        with file.open("rb") as handle:
            if os.fstat(handle.fileno()).st_ino != inode or os.fstat(handle.fileno()).st_size < offset:
                return None
            handle.seek(offset)
            return _parse(handle.read(), file, offset), (inode, _complete(handle))
    except FileNotFoundError:
        return None


def _complete(handle: Any) -> int:
    """The offset just past the file's last complete line (a torn last line is not read)."""
    size = handle.seek(0, os.SEEK_END)
    while size > 0:
        handle.seek(max(size - 4096, 0))
        block = handle.read(size - max(size - 4096, 0))
        cut = block.rfind(b"\n")
        if cut >= 0:
            return max(size - 4096, 0) + cut + 1
        size = max(size - 4096, 0)
    return 0


def _parse(data: bytes, file: Path, offset: int) -> list[Record]:
    records = []
    lines = data.split(b"\n")[:-1]  # the part after the last newline is a torn write: never acknowledged
    for n, line in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            raise JournalError(f"{file}: unreadable catalogue journal (line {n + 1} after byte {offset}): "
                               f"{str(err).splitlines()[0]}") from None
        if "format" in record:
            if record["format"] != FORMAT:
                raise JournalError(f"{file}: catalogue journal format {record['format']!r}, expected {FORMAT!r}")
            continue
        records.append(record)
    return records


def _legacy(bundle_path: Path) -> list[Record]:
    file = bundle_path / LEGACY_JOURNAL
    try:
        document = json.loads(file.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        raise JournalError(f"{file}: unreadable catalogue journal: {str(err).splitlines()[0]}") from None
    if not isinstance(document, dict):
        raise JournalError(f"{file}: unreadable catalogue journal: not a JSON object")
    return [{"added": document.get("added", []), "retired": document.get("retired", [])}]


def append_record(bundle_path: Path, record: Record) -> None:
    """Append one change, on disk when this returns. Call it holding `journal_lock`."""
    file = journal_file(bundle_path)
    if not file.exists():
        seed = [r for r in _legacy(bundle_path) if r.get("added") or r.get("retired")]
        write_records(bundle_path, seed)
    line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    fd = os.open(file, os.O_WRONLY | os.O_APPEND)
    try:
        with open(file, "rb") as handle:  # a torn last line (a kill -9 mid-write): cut before appending
            end = _complete(handle)
            torn = handle.seek(0, os.SEEK_END) != end
        if torn:
            os.ftruncate(fd, end)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_records(bundle_path: Path, records: list[Record]) -> None:
    """Replace the journal of ``bundle_path`` with ``records`` (atomically: a new file renamed over it)."""
    home = journal_home(bundle_path)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in [{"format": FORMAT}, *records])
    atomic_write(home / JOURNAL, lambda p: p.write_text(text))
    sync(home)


@contextmanager
def journal_lock(bundle_path: Path) -> Iterator[None]:
    """Hold the journal's lock file (flock, waiting for it) beside the journal: one catalogue change at a time
    across the service's worker processes and replicas. A lock file replaced while waiting (`seqrec export` swaps
    a whole bundle folder, where a bundle outside ARTIFACTS/versions keeps its journal) is opened again, so every
    holder locks the same file."""
    lock = journal_home(bundle_path) / LOCK
    while True:
        with lock.open("a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                current = os.stat(lock).st_ino
            except FileNotFoundError:
                continue
            if current != os.fstat(handle.fileno()).st_ino:
                continue
            yield
            return


def signature(bundle_path: Path) -> tuple[int, int] | str:
    """What changes when the journal does, cheap to read every poll: (inode, size) of the journal file, else the
    previous format's text (small), else ""."""
    try:
        stat = journal_file(bundle_path).stat()
        return stat.st_ino, stat.st_size
    except FileNotFoundError:
        legacy = bundle_path / LEGACY_JOURNAL
        return legacy.read_text() if legacy.exists() else ""
