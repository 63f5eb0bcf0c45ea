"""``GET /healthz`` (liveness: the process is up), ``/readyz`` (readiness: what it serves, whether the store
answers and takes writes; 503 when it does not) and ``/metrics`` (Prometheus).

A load balancer or an orchestrator takes a replica out of rotation on a failing readiness check and restarts it
on a failing liveness check: a Redis outage makes every replica unready, none dead. Neither body names a file or
an address (the bundle's folder, Redis's host): the version, the model's shape and the store's state say enough.
"""

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
async def readyz(engine: EngineDep, store: StoreDep, response: Response) -> dict[str, Any]:
    reachable = await store.ping()
    writable = reachable and await store.writable()
    described: dict[str, Any] = {k: v for k, v in engine.bundle.describe().items() if k != "path"}
    response.status_code = 200 if writable else 503
    return {"status": "ready" if writable else "degraded", **described,
            "store": {"kind": store.name, "reachable": reachable, "writable": writable}, "worker": os.getpid(),
            "seqrec_version": seqrec_version()}


@router.get("/metrics", response_class=Response, responses=METRICS)
async def prometheus(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
