"""The published side of an artifacts folder: ``versions/<id>/`` bundles and the ``current`` symlink.

`seqrec pipeline` publishes into it; `seqrec catalog`, the warm start and the reliability benches read it. The
symlink is only ever replaced by a rename, so a reader sees the old version or the new one, never neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.atomic import exclusive, sync

VERSIONS, CURRENT = "versions", "current"
LOCK = ".pipeline.lock"
PUBLISH_RECORD = "pipeline.json"
MINING, PRUNED = ".mining", ".pruned"  # <version>.mining: train-ranker's cache; .<version>.pruned: being deleted
VERSION_ID = re.compile(r"\d{8}T\d{6}Z-")  # how a version id starts (retriever.artifact: its UTC creation time)
STALE_AFTER = 6 * 3600  # seconds untouched before a writer's leftover folder counts as abandoned


@contextmanager
def pipeline_lock(artifacts: Path) -> Iterator[None]:
    """Hold ARTIFACTS/.pipeline.lock for one `seqrec pipeline` run: a second run on the same folder (a cron job
    that overlaps a slow one) would resume the same work folder, or prune what the first is publishing."""
    with exclusive(artifacts / LOCK, lambda holder: f"{artifacts}: another seqrec pipeline holds it ({holder}); "
                   "wait for that run to end, or choose another --out"):
        yield


def switch_current(artifacts: Path, target: Path) -> None:
    """Point ARTIFACTS/current at ``target``: a temporary symlink renamed over the old one (atomic)."""
    link = artifacts / CURRENT
    tmp = artifacts / f".{CURRENT}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(target, artifacts))
    os.replace(tmp, link)
    sync(artifacts)  # the switch itself on disk: after a power cut, `current` is the new link


def prune_versions(artifacts: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` published bundles of ARTIFACTS/versions, never the one `current` names;
    returns the bundles deleted. Call it holding `pipeline_lock`.

    Newest by the publish time the bundle records (pipeline.json's ``published_at``, else the manifest's
    ``created_at``; then the version id, which starts with its UTC creation time), not by the folder's mtime:
    `seqrec export` and `seqrec train-ranker` rewrite a version (a swap of folders) and so made an old version
    look new, and the previous one, the natural rollback target, was deleted instead. Only complete bundles count
    (a manifest naming files that are all there): a temp folder of a killed writer, or a version half deleted by
    a killed prune, is not one. A deleted version's mining cache (``<version>.mining``) goes with it. Leftovers
    (`stale_leftovers`) go once nothing has touched them for STALE_AFTER seconds."""
    folder = artifacts / VERSIONS
    if not folder.is_dir():
        return []
    current = (artifacts / CURRENT).resolve() if (artifacts / CURRENT).exists() else None
    # Publish times have whole seconds: of two versions published in one second, `current` is the newer (the
    # version id's hash broke the tie, so keep 1 could keep the other one, and `current` beside it).
    ranked = sorted(((published, path.resolve() == current, name, path) for path in folder.iterdir()
                     if (key := publish_key(path)) is not None for published, name in [key]), reverse=True)
    removed = []
    for _, is_current, _, old in ranked[keep:]:
        if is_current:
            continue
        _remove(old)
        _remove(old.with_name(f"{old.name}{MINING}"))
        removed.append(old)
    for leftover in stale_leftovers(folder, current):
        _remove(leftover)
    return removed


def publish_key(path: Path) -> tuple[str, str] | None:
    """(publish time, version id) of the complete bundle ``path``; None for anything else (a file, a link, a
    temp folder, a mining cache, a bundle missing a file its manifest lists, as a killed deletion leaves it)."""
    if path.name.startswith(".") or path.is_symlink() or not path.is_dir():
        return None
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        files, created = manifest["sha256"], str(manifest["created_at"])
        if not isinstance(files, dict) or not all((path / name).is_file() for name in files):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        published = str(json.loads((path / PUBLISH_RECORD).read_text())["published_at"])
    except (OSError, ValueError, KeyError, TypeError):  # a bundle copied in by hand
        published = created
    return published, path.name


def stale_leftovers(folder: Path, current: Path | None, now: float | None = None) -> list[Path]:
    """Folders under ``folder`` (ARTIFACTS/versions) that a killed writer left: a killed prune's
    ``.<version>.pruned`` at once; after STALE_AFTER seconds untouched, other hidden ones (a killed `seqrec
    export`'s staging copy ``.<version>.XXXXXXXX``, a swap's ``.<version>.old.XXXXXXXX``), folders named like a
    version that are not a complete bundle (half deleted by an older seqrec) and mining caches whose version is
    gone. Nothing records whether such a writer still runs (an export holds no lock), so the test is time: a live
    writer touches its folder when it starts and with every file it renames in, and none waits hours between."""
    now = time.time() if now is None else now
    found = []
    for path in folder.iterdir():
        if path.is_symlink() or not path.is_dir() or path.resolve() == current or publish_key(path) is not None:
            continue
        name = path.name
        if name.startswith(".") and name.endswith(PRUNED):  # only a prune, under the pipeline lock, makes one
            found.append(path)
            continue
        orphan = name.endswith(MINING) and not path.with_name(name[: -len(MINING)]).is_dir()
        ours = name.startswith(".") or orphan or (VERSION_ID.match(name) is not None and not name.endswith(MINING))
        if ours and now - _last_touched(path) > STALE_AFTER:
            found.append(path)
    return found


def _last_touched(folder: Path) -> float:
    """The newest mtime of ``folder`` and everything under it (links not followed)."""
    newest = folder.lstat().st_mtime
    for root, folders, files in os.walk(folder):
        for name in (*folders, *files):
            with contextlib.suppress(OSError):  # removed meanwhile
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
    return newest


def _remove(path: Path) -> None:
    """Rename ``path`` to a hidden ``.<name>.pruned`` first, then delete it: a prune killed halfway leaves a folder
    that no reader takes for a version, and that the next prune removes."""
    if not path.exists() or path.is_symlink():
        return
    trash = path if path.name.startswith(".") else path.with_name(f".{path.name}{PRUNED}")
    if trash != path:
        shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(path, trash)
        except OSError:
            trash = path
    shutil.rmtree(trash, ignore_errors=True)
