"""``GET /``: a page to try the service in a browser (``service/http/static``, plain HTML and JS, mounted at
``/static`` by the app)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC = Path(__file__).parent.parent / "static"  # service/http/static

router = APIRouter()


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html")
