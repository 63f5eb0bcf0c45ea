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


def get_state(request: Request) -> State:
    state: State = request.app.state.seqrec
    return state


def get_engine(request: Request) -> Engine:
    return get_state(request).engine


def get_store(request: Request) -> HistoryStore:
    return get_state(request).store


def get_metrics(request: Request) -> Metrics:
    return get_state(request).metrics


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
