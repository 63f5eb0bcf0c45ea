"""Fetch and unpack the official MovieLens archives, checked against their MD5s.

GroupLens does not allow redistribution, so the project ships no MovieLens data; this
is how users get it. Nothing half-written is ever left under its final name: the zip
is downloaded to a temporary file and renamed once its MD5 matches, and it is unpacked
into a temporary folder that is renamed into place.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

from tqdm import tqdm

from common.atomic import replace_dir
from offline.data.errors import DataError
from offline.data.readers.movielens import OFFICIAL_BASE_URL, release

URL_ENV = "SEQREC_MOVIELENS_URL"
_CHUNK_BYTES = 1 << 20
_TIMEOUT_S = 60


def download_movielens(
    variant: str,
    cache_dir: str | Path,
    *,
    base_url: str | None = None,
    md5: str | None = None,
    progress: bool = True,
) -> Path:
    """Download ``<base_url>/<variant>.zip`` into ``cache_dir``, check it and unpack it.

    base_url: where the archives live; default the environment variable
        ``SEQREC_MOVIELENS_URL`` (a mirror, or a local server), else GroupLens'
        https://files.grouplens.org/datasets/movielens.
    md5: the archive's expected MD5; default the official one GroupLens publishes.
    progress: show a progress bar on stderr.

    Returns the unpacked folder (``cache_dir/ml-100k``, ``cache_dir/ml-10M100K``, ...),
    which ``read_movielens`` accepts. When that folder exists next to a zip with the right
    MD5, nothing is downloaded. A wrong MD5 or a network error raises DataError naming
    the URL; the partial download is deleted.
    """
    info = release(variant)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    base = base_url or os.environ.get(URL_ENV) or OFFICIAL_BASE_URL
    url = f"{base.rstrip('/')}/{variant}.zip"
    expected = (md5 or info.md5).lower()
    archive = cache / f"{variant}.zip"
    target = cache / info.folder
    have_archive = archive.is_file() and _file_md5(archive) == expected
    if have_archive and target.is_dir():
        return target
    if not have_archive:
        _fetch(url, archive, expected, progress)
    _unpack(archive, target)
    return target


def _fetch(url: str, archive: Path, expected_md5: str, progress: bool) -> None:
    fd, temp_name = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".part")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            actual = _download(url, out, progress)
        if actual != expected_md5:
            raise DataError(url, f"MD5 mismatch: expected {expected_md5}, got {actual}")
        os.replace(temp, archive)
    finally:
        temp.unlink(missing_ok=True)


def _download(url: str, out: BinaryIO, progress: bool) -> str:
    """Stream ``url`` into ``out``; the MD5 of what was written."""
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            name = url.rsplit("/", 1)[-1]
            with tqdm(total=total, desc=name, unit="B", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
                while chunk := response.read(_CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as err:
        raise DataError(url, f"download failed: HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        raise DataError(url, f"download failed: {err.reason}") from None
    except (OSError, http.client.HTTPException) as err:  # timeouts and dropped connections mid-body
        raise DataError(url, f"download failed: {err!r}") from None
    return digest.hexdigest()


def _file_md5(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


def _unpack(archive: Path, target: Path) -> None:
    """Extract into a temporary folder, then rename the archive's folder to ``target``."""
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".unpack"))
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    _check_member(archive, staging, member)
                zf.extractall(staging)
        except zipfile.BadZipFile as err:
            raise DataError(archive, f"not a valid zip archive: {err}") from None
        replace_dir(_unpacked_root(staging, target.name), target)  # a crash keeps the old folder whole
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpacked_root(staging: Path, folder: str) -> Path:
    """The folder holding the files: the expected subfolder, a single top folder, or the root."""
    if (staging / folder).is_dir():
        return staging / folder
    entries = list(staging.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return staging


def _check_member(archive: Path, staging: Path, name: str) -> None:
    """Refuse member paths that would land outside the target (absolute, drive, ``..``)."""
    windows = PureWindowsPath(name)
    unsafe = (
        PurePosixPath(name).is_absolute()
        or windows.is_absolute()
        or bool(windows.drive)
        or ".." in windows.parts  # PureWindowsPath splits on both / and \
        or not (staging / name).resolve().is_relative_to(staging.resolve())
    )
    if unsafe:
        raise DataError(archive, f"unsafe member path {name!r}: it would unpack outside the target folder")
