"""Files that are either fully written or not there: write to a temp name, flush it to disk, then rename."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.errors import SeqrecError, manifest_kind

MANIFEST = "manifest.json"  # what a dataset, an artifact or a ranker folder describes itself in
UNREADABLE = object()  # a manifest.json that is there but cannot be read or parsed


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temp file beside ``path``, flush it to disk, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        sync(tmp)
        os.replace(tmp, path)
        sync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def sync(path: Path) -> None:
    """fsync a file, or a folder's entries. A rename is atomic for a process that dies, but after a power cut a
    file renamed before its data reached the disk can be there empty, and a rename not yet on disk undone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # a file system that cannot sync this
            raise
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """`sync` every file and folder under ``folder`` (links are not followed), the folder last."""
    for root, folders, files in os.walk(folder, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                sync(Path(root, name))
        for name in folders:
            if not os.path.islink(os.path.join(root, name)):
                sync(Path(root, name))
    sync(folder)


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` of ``obj`` to ``path``, atomically. Through a file handle: given a path, torch names
    the archive's inner folder after the file, here the temp name with its process id, so equal weights
    written by two processes had different bytes and digests (and bundle versions)."""
    import torch

    def save(tmp: Path) -> None:
        with tmp.open("wb") as handle:
            torch.save(obj, handle)

    atomic_write(path, save)


def write_json(path: Path, payload: Any) -> None:
    """``payload`` as indented JSON in ``path``, written atomically (its folder made first); a value JSON cannot
    encode is written as its str()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, default=str) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in records)
    atomic_write(path, lambda p: p.write_text(text))


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def staging_dir(out: Path) -> Path:
    """A new hidden folder beside ``out`` to write it in before `replace_dir`, with the mode a plain mkdir gives
    (mkdtemp's 0700 stayed on the published folder: a service or a colleague under another user could not read
    a prepared dataset or a report)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    return staging


def replace_dir(staging: Path, out: Path) -> None:
    """Replace the folder ``out`` by ``staging`` (a sibling) with renames, so readers never see half a folder.

    Where the kernel can swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE), ``out`` is never
    absent: a reader opens either the old folder or the new one. Elsewhere ``out`` is moved aside and then
    replaced, and a reader that looks between the two renames finds no folder. ``staging`` is flushed to disk
    (`sync_tree`) before the first rename."""
    sync_tree(staging)
    if not out.exists():
        os.replace(staging, out)
        sync(out.parent)
        return
    if _exchange(staging, out):
        sync(out.parent)
        if staging.is_symlink():  # ``out`` was a link: it is replaced, what it pointed to is left alone
            staging.unlink()
        else:
            shutil.rmtree(staging, ignore_errors=True)  # now the old folder
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.replace(out, retired / out.name)
    os.replace(staging, out)
    sync(out.parent)
    shutil.rmtree(retired, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` atomically; False where this system or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # old kernel, or a file system without exchange
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def check_replaceable(out: Path, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse a ``replace_dir`` target that is a file, or a folder holding files that ``ours`` does not
    recognise as an earlier output of the same command (a dataset, a bundle: a typo must not delete them), or,
    where its manifest.json lists the files it wrote (``sha256``), any other entry: a model trained into a
    dataset's folder went without a word when `seqrec prepare --overwrite` replaced the folder."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SeqrecError(f"{out}: a file, where {what} is to be written")
    if any(out.iterdir()) and not ours(out):
        raise SeqrecError(f"{out}: holds files that are not {what}, and the output replaces the folder as a "
                          "whole; choose a new or empty folder")
    foreign = _unlisted_entries(out)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise SeqrecError(f"{out}: holds {out / foreign[0]}{more}, which {what} does not write, and the output "
                          "replaces the folder as a whole; move it out first, or choose a new folder")


def _unlisted_entries(folder: Path) -> list[str]:
    """The names in ``folder`` that neither are its manifest.json nor appear in the manifest's ``sha256`` (the
    files it wrote); none when the manifest lists no files."""
    manifest = _manifest(folder)
    listed = manifest.get("sha256") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict):
        return []
    ours = {MANIFEST, *(Path(name).parts[0] for name in listed if Path(name).parts)}
    return sorted(entry.name for entry in folder.iterdir() if entry.name not in ours)


def _manifest(folder: Path) -> object:
    """FOLDER/manifest.json parsed; None when there is none, UNREADABLE when it cannot be read or parsed."""
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return UNREADABLE


def folder_kind(folder: Path) -> str | None:
    """What FOLDER/manifest.json says the folder is (`manifest_kind`), "a manifest.json" for another one, None
    without one: for refusing an output folder that already holds a dataset or a bundle."""
    manifest = _manifest(folder)
    if manifest is None:
        return None
    return manifest_kind(manifest) or "a manifest.json"


def enclosing_seqrec_folder(path: Path, formats: Collection[str] | None = None) -> tuple[Path, str] | None:
    """The nearest folder above ``path`` (links resolved) whose manifest.json is one of seqrec's, with what it is
    (`manifest_kind`); only the formats in ``formats`` ("seqrec.prepared", ...) when given. None when none is."""
    for folder in path.resolve().parents:
        manifest = _manifest(folder)
        kind = manifest_kind(manifest)
        found = manifest.get("format") if isinstance(manifest, dict) else None
        if kind is not None and (formats is None or str(found).split("/")[0] in formats):
            return folder, kind
    return None


def refuse_seqrec_folder(out: Path, flag: str = "--out") -> None:
    """An output folder that holds a dataset, an artifact or a ranker of seqrec's is a mistake: refuse it. So is
    one inside a prepared dataset, which `seqrec prepare --overwrite` replaces as a whole."""
    kind = folder_kind(out) if out.is_dir() else None
    if kind is not None:
        raise SeqrecError(f"{out} already holds {kind}; choose a new {flag}")
    above = enclosing_seqrec_folder(out, ("seqrec.prepared",))
    if above is not None:
        raise SeqrecError(f"{out} is inside {above[0]}, {above[1]} (`seqrec prepare --overwrite` replaces that "
                          f"folder as a whole); choose a {flag} outside it")


@contextmanager
def exclusive(lock: Path, refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold the file ``lock`` (flock) for the block, or raise SeqrecError(refusal(holder)) at once when another
    process holds it; holder reads "pid N, since T". The kernel drops the lock when the process ends, however it
    ends, so a killed run leaves none behind. On release the file goes, with the folders made for it when they
    are left empty (a run refused on its input leaves nothing)."""
    made = [folder for folder in (lock.parent, *lock.parent.parents) if not folder.exists()]
    while True:
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = lock.open("a+")
        except FileNotFoundError:  # a holder that just ended removed the folder between our mkdir and open
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise SeqrecError(refusal(holder)) from None
        if _same_file(lock, handle.fileno()):
            break
        handle.close()  # locked a file its holder removed on release: lock the one now at the path
    try:
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}, since {datetime.now(UTC).isoformat(timespec='seconds')}\n")
        handle.flush()
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the lock is released, so nobody locks a file about to go
        handle.close()
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
