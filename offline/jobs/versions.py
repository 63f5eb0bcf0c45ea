"""The published side of an artifacts folder: ``versions/<id>/`` bundles and the ``current`` symlink.

`seqrec pipeline` publishes into it; `seqrec catalog`, the warm start and the reliability benches read it. The
symlink is only ever replaced by a rename, so a reader sees the old version or the new one, never neither.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from retriever.atomic import exclusive, sync

VERSIONS, CURRENT = "versions", "current"
LOCK = ".pipeline.lock"


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
    """Delete all but the newest ``keep`` versions; never the one `current` names."""
    folder = artifacts / VERSIONS
    current = (artifacts / CURRENT).resolve() if (artifacts / CURRENT).exists() else None
    versions = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in versions[keep:]:
        if current is not None and old.resolve() == current:
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed
