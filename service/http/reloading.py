"""Hot reload: ``POST /admin/reload`` and, with several workers, each worker watching ``ARTIFACTS/current``.

`reload_current` loads what ``current`` names and swaps it in once it passes validation (a bundle that
fails is refused and the old one keeps serving). A POST reaches one worker only, so with
``SEQREC_WORKERS`` > 1 every worker also runs `watch_current`: every ``SEQREC_RELOAD_POLL_S`` seconds
it compares ``current`` (its target, its manifest and its ranker's) with what it serves and reloads on a
change, so a publish reaches every worker within one poll, with or without the POST. It also watches the
bundle's catalogue journal and applies it when another worker has changed the catalogue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from ranker.artifact import FOLDER as RANKER_FOLDER
from service.http.deps import State
from service.system.bundle import Bundle, BundleError
from service.system.catalog import synced
from service.system.journal import signature
from service.system.loader import resolve_bundle

log = logging.getLogger("seqrec.service")


async def reload_current(s: State) -> dict[str, Any]:
    """The `ReloadResponse` body; `BundleError` when ``current`` cannot be served (the old bundle stays)."""
    start = time.perf_counter()
    try:
        path = resolve_bundle(s.settings.artifacts)
        current = s.engine.bundle
        if path == current.path and same_manifest(current):
            await _sync_catalogue(s)  # the model is the same; another worker may have changed its catalogue
            return {"status": "unchanged", "model_version": current.version, "previous_version": current.version,
                    "seconds": round(time.perf_counter() - start, 3)}
        old, new = await s.engine.reload(path)
    except BundleError as err:
        s.metrics.reloads.labels("refused").inc()
        log.warning("reload refused: %s", err)
        raise
    s.metrics.reloads.labels("ok").inc()
    s.metrics.set_model(new)
    log.info("reloaded: %s -> %s", old.version, new.version)
    return {"status": "reloaded", "model_version": new.version, "previous_version": old.version,
            "seconds": round(time.perf_counter() - start, 3)}


def same_manifest(bundle: Bundle) -> bool:
    """Whether the manifests on disk (the retriever's and BUNDLE/ranker's) are still the ones the bundle was
    loaded with: a folder rewritten in place (`seqrec export`, `seqrec train-ranker`) is a new bundle."""
    try:
        if json.loads((bundle.path / "manifest.json").read_text()) != bundle.artifact.manifest.to_dict():
            return False
        ranker = bundle.path / RANKER_FOLDER / "manifest.json"
        if bundle.ranker is None:
            return not ranker.exists()
        return bool(json.loads(ranker.read_text()) == bundle.ranker.manifest.to_json_dict())
    except (OSError, ValueError):
        return False


def _published(s: State) -> tuple[str, str, str, object] | None:
    """(target, manifest text, ranker manifest text or "", the catalogue journal's `signature`) of ``current``
    now; None when it cannot be read."""
    try:
        path = resolve_bundle(s.settings.artifacts)
        ranker = path / RANKER_FOLDER / "manifest.json"
        return (str(path), (path / "manifest.json").read_text(), ranker.read_text() if ranker.exists() else "",
                signature(path))
    except (BundleError, OSError):
        return None


async def watch_current(s: State, every_s: float) -> None:
    """Reload whenever ``current`` changes, and apply the catalogue journal when only it changed (another
    worker's `POST /admin/items` or `DELETE /admin/items/{id}`); a refused publish is not retried until
    ``current`` changes again."""
    seen = await asyncio.to_thread(_published, s)
    while True:
        await asyncio.sleep(every_s)
        now = await asyncio.to_thread(_published, s)
        if now is None or now == seen:
            continue
        journal_only = seen is not None and now[:3] == seen[:3]
        seen = now
        if journal_only:
            await _sync_catalogue(s)
            continue
        with contextlib.suppress(BundleError):  # logged and counted; the old bundle keeps serving
            await reload_current(s)


async def _sync_catalogue(s: State) -> None:
    """Serve the journal on disk: another worker changed the catalogue (a retired item must not be served here)."""
    try:
        await s.engine.update(synced)
    except (BundleError, OSError) as err:  # the old catalogue keeps serving; the next change tries again
        log.warning("catalogue journal not applied: %s", err)
