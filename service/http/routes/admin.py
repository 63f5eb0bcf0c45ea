"""``POST /admin/reload``: load ``ARTIFACTS/current`` again and swap it in once it passes validation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from service.http.deps import StateDep
from service.http.reloading import reload_current
from service.http.schemas import REFUSED, TOO_LARGE, ReloadResponse
from service.system.bundle import BundleError

keyed = APIRouter()


@keyed.post("/admin/reload", response_model=ReloadResponse, responses={**REFUSED, **TOO_LARGE})
async def reload(s: StateDep) -> dict[str, Any]:
    """Reload this worker; with several workers the others follow within SEQREC_RELOAD_POLL_S (`service.reloading`)."""
    try:
        return await reload_current(s)
    except BundleError as err:
        raise HTTPException(409, f"bundle refused, still serving {s.engine.bundle.version}: {err}") from None
