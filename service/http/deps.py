"""What routes declare they need: the app's state (settings, engine, history store, metrics), the API-key
check of the keyed routes (writes, /admin, stored histories; `check_key` for POST /recommend with a user_id, which
checks it in the route) and the UTF-8 check of the routes with ids in their paths."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Depends, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.http.engine import Engine
from service.http.metrics import Metrics
from service.http.settings import Settings
from service.http.store import HistoryStore


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
# Declared in the OpenAPI document as the security scheme of the keyed routes; `require_key` checks it.
BEARER = HTTPBearer(auto_error=False, description="SEQREC_API_KEY, needed on writes, /admin, "
                                                  "GET /users/{id}/history and POST /recommend with a user_id when "
                                                  "the service has one")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


async def require_key(credentials: BearerDep, state: StateDep) -> None:
    """401 unless the request carries the service's key; installed on the keyed routes only when there is one."""
    check_key(credentials, state.settings.api_key_value() or "")


def check_key(credentials: HTTPAuthorizationCredentials | None, key: str) -> None:
    """401 unless ``credentials`` (`BEARER`'s reading of the request) carry ``key``: `require_key`, and POST
    /recommend for a request with a user_id (its body says whether it needs the key)."""
    # Constant-time over bytes: the key is printable ASCII (`Settings`); a header is read as Latin-1, so its bytes
    # are compared as sent (UTF-8 bytes of a non-ASCII value never equal an ASCII key)
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode("latin-1"), key.encode()):
        raise HTTPException(401, "this endpoint needs `Authorization: Bearer <SEQREC_API_KEY>`",
                            headers={"WWW-Authenticate": "Bearer"})


async def utf8_path(request: Request) -> None:
    """422 naming the id when the path's percent-decoded bytes are not UTF-8: the server decodes them with U+FFFD
    for each bad byte, so `/users/%FF/history`, `/users/%FE/history` and `/users/%EF%BF%BD/history` reached one
    user's history (the JSON bodies refuse such text). Installed on the routers whose routes take ids in paths."""
    raw = request.scope.get("raw_path")  # still percent-encoded; an ASGI server may leave it out
    if not raw:
        return
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError as err:
        byte = err.object[err.start]
        # the fixed segments of a matched route are ASCII: the bad bytes are in an id, now holding a U+FFFD
        locs: list[tuple[str, ...]] = [("path", name) for name, value in request.path_params.items()
                                       if "\ufffd" in str(value)]
        message = (f"not UTF-8 once percent-decoded (the byte %{byte:02X}); an id in a path is its UTF-8 bytes, "
                   "percent-encoded (U+FFFD is %EF%BF%BD)")
        raise RequestValidationError([{"type": "string_unicode", "loc": loc, "msg": message}
                                      for loc in locs or [("path",)]]) from None


async def utf8_query(request: Request) -> None:
    """422 naming the parameter when a query string value's percent-decoded bytes are not UTF-8: the server decodes
    them with U+FFFD, so `/items?query=%FF` searched for U+FFFD, as the path ids did (`utf8_path`)."""
    raw: bytes = request.scope.get("query_string") or b""
    if b"%" not in raw:  # plain ASCII, as the server hands it over
        return
    locs: list[tuple[str, ...]] = []
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        try:
            unquote_to_bytes(name).decode("utf-8")
            unquote_to_bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            locs.append(("query", unquote_to_bytes(name).decode("utf-8", "replace")))
    if locs:
        message = ("not UTF-8 once percent-decoded; a query value is its UTF-8 bytes, percent-encoded "
                   "(U+FFFD is %EF%BF%BD)")
        raise RequestValidationError([{"type": "string_unicode", "loc": loc, "msg": message} for loc in locs])
