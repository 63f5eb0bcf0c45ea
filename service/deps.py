"""What routes declare they need: the app's state (settings, engine, history store, metrics) and the API-key
check of the write routes."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.engine import Engine
from service.metrics import Metrics
from service.settings import Settings
from service.store import HistoryStore


@dataclass(frozen=True)
class State:
    """What the routes share, built by the app's lifespan once the bundle is loaded."""

    settings: Settings
    engine: Engine
    store: HistoryStore
    metrics: Metrics


# The dependencies are coroutines: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per
# request and dependency (py-spy on the served /recommend: an AnyIO worker thread busy on every request).
async def get_state(request: Request) -> State:
    return _state(request)


async def get_engine(request: Request) -> Engine:
    return _state(request).engine


async def get_store(request: Request) -> HistoryStore:
    return _state(request).store


async def get_metrics(request: Request) -> Metrics:
    return _state(request).metrics


def _state(request: Request) -> State:
    state: State = request.app.state.seqrec
    return state


StateDep = Annotated[State, Depends(get_state)]
EngineDep = Annotated[Engine, Depends(get_engine)]
StoreDep = Annotated[HistoryStore, Depends(get_store)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
# Declared in the OpenAPI document as the security scheme of the write routes; `require_key` checks it.
BearerDep = Annotated[HTTPAuthorizationCredentials | None,
                      Security(HTTPBearer(auto_error=False, description="SEQREC_API_KEY, needed on writes and /admin "
                                                                        "when the service has one"))]


async def require_key(credentials: BearerDep, state: StateDep) -> None:
    """401 unless the request carries the service's key; installed on the write routes only when there is one."""
    key = (state.settings.api_key_value() or "").encode()
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), key):
        raise HTTPException(401, "this endpoint needs `Authorization: Bearer <SEQREC_API_KEY>`",
                            headers={"WWW-Authenticate": "Bearer"})
