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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.errors import SeqrecError


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
