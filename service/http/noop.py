"""A FastAPI app that parses the service's request body and answers a constant: the framework ceiling that
`seqrec bench serve` (`offline.bench.serve`) measures beside the service, with no model work."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field


class NoopRequest(BaseModel):
    """The service's request body, parsed and validated the same way, then ignored."""

    user_id: str | None = None
    history: list[str | int] | None = None
    k: int = Field(10, ge=1, le=1000)
    candidates: int = Field(200, ge=1)
    exclude_seen: bool | None = None
    rerank: bool = True


def noop_app() -> FastAPI:
    """POST /recommend parses the service's request body and answers a constant; GET /readyz."""
    app = FastAPI(title="seqrec no-op ceiling")

    @app.post("/recommend")
    async def recommend(request: NoopRequest) -> dict[str, Any]:
        return {"items": [], "model_version": "noop", "k": request.k}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app
