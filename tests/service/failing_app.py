"""An app factory whose start-up fails, for `seqrec serve`'s multi-worker supervisor (test_serve_cli.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI


def create_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("this worker cannot start")
        yield

    return FastAPI(lifespan=lifespan)
