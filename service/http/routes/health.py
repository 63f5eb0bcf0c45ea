"""``GET /healthz`` (the process is up), ``/readyz`` (what it serves, whether the store answers and takes
writes) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from common import seqrec_version
from service.http.deps import EngineDep, MetricsDep, StoreDep
from service.http.schemas import METRICS

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz")
async def readyz(engine: EngineDep, store: StoreDep) -> dict[str, Any]:
    reachable = await store.ping()
    writable = reachable and await store.writable()
    return {"status": "ready" if writable else "degraded", **engine.bundle.describe(),
            "store": {"kind": store.name, "reachable": reachable, "writable": writable}, "worker": os.getpid(),
            "seqrec_version": seqrec_version()}


@router.get("/metrics", response_class=Response, responses=METRICS)
async def prometheus(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
