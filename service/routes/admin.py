"""``POST /admin/reload``: load ``ARTIFACTS/current`` again and swap it in once it passes validation."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fastapi import APIRouter, HTTPException

from service.bundle import Bundle, BundleError, resolve_bundle
from service.deps import StateDep
from service.schemas import REFUSED, TOO_LARGE, ReloadResponse

log = logging.getLogger("seqrec.service")

writes = APIRouter()


@writes.post("/admin/reload", response_model=ReloadResponse, responses={**REFUSED, **TOO_LARGE})
async def reload(s: StateDep) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        path = resolve_bundle(s.settings.artifacts)
        current = s.engine.bundle
        if path == current.path and _same_manifest(current):
            return {"status": "unchanged", "model_version": current.version, "previous_version": current.version,
                    "seconds": round(time.perf_counter() - start, 3)}
        old, new = await s.engine.reload(path)
    except BundleError as err:
        s.metrics.reloads.labels("refused").inc()
        log.warning("reload refused: %s", err)
        raise HTTPException(409, f"bundle refused, still serving {s.engine.bundle.version}: {err}") from None
    s.metrics.reloads.labels("ok").inc()
    s.metrics.set_model(new)
    log.info("reloaded: %s -> %s", old.version, new.version)
    return {"status": "reloaded", "model_version": new.version, "previous_version": old.version,
            "seconds": round(time.perf_counter() - start, 3)}


def _same_manifest(bundle: Bundle) -> bool:
    """Whether the bundle's manifest on disk is still the one it was loaded with (a folder rewritten in place
    is a new bundle)."""
    try:
        return bool(json.loads((bundle.path / "manifest.json").read_text()) == bundle.artifact.manifest.to_dict())
    except (OSError, ValueError):
        return False
