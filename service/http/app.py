"""The HTTP service: ``POST /recommend`` and friends (OpenAPI at ``/docs``).

    python -m uvicorn service.http.app:create_app --factory --port 8000   (or `seqrec serve`)

Settings come from ``SEQREC_*`` environment variables (`service.http.settings.Settings`). Client
mistakes get a 4xx with a message naming the field; an unreachable Redis gets a 503 only where
the stored history is needed (`user_id`-only requests, events, history reads and deletes). ``GET /`` serves
a page to try the service in a browser (``service/http/static``, plain HTML and JS).

This module wires the app: settings, the lifespan that loads the bundle, the metrics middleware, the
error handlers and the routers of `service.http.routes`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common import seqrec_version
from service.http.deps import State, require_key, utf8_path, utf8_query
from service.http.engine import Engine, Overloaded, set_threads
from service.http.guards import AllowedHosts, without_paths
from service.http.metrics import Metrics
from service.http.reloading import watch_current
from service.http.routes import admin, catalog, events, health, history, items, recommend, web
from service.http.schemas import UNAUTHORIZED
from service.http.settings import Settings
from service.http.store import ForeignHistory, StoreUnavailable, make_store
from service.system.bundle import Bundle
from service.system.catalog import load_served
from service.system.loader import resolve_bundle

log = logging.getLogger("seqrec.service")
# In the order the routes are matched and documented; `KEYED` need the API key when the service has one (the
# writes, /admin, and GET /users/{id}/history: a stored history is personal data). POST /recommend checks the key
# itself, for a body with a user_id only; a service with a key documents it as `recommend.guarded`.
ROUTERS = (recommend.router, events.keyed, history.keyed, items.router, web.router, health.router, admin.keyed,
           catalog.keyed)
KEYED = (events.keyed, history.keyed, admin.keyed, catalog.keyed)


def create_app(settings: Settings | None = None, *, bundle: Bundle | None = None) -> FastAPI:
    """The app; the bundle (unless given, already loaded) is loaded in the lifespan, and a bundle
    that fails to load stops the start-up."""
    settings = settings or Settings()
    metrics = Metrics()
    app = FastAPI(title="seqrec", version=seqrec_version(), max_body_size=settings.max_body_bytes,
                  lifespan=functools.partial(lifespan, settings=settings, metrics=metrics, preloaded=bundle),
                  exception_handlers={RequestValidationError: invalid, StarletteHTTPException: http_error,
                                      StoreUnavailable: store_down, ForeignHistory: foreign_history,
                                      Overloaded: overloaded},
                  description="Two-stage sequential recommendations: retrieval over a FAISS index, then reranking.")
    app.add_middleware(_Measured, metrics=metrics)
    app.add_middleware(_HeadAsGet)
    app.add_middleware(AllowedHosts, allowed=settings.host_allow_list())  # outermost: before anything reads it
    # Without a key, every route is open, and the OpenAPI document says so (no security scheme, no 401).
    guarded = settings.api_key_value() is not None
    for router in ROUTERS:
        keyed = guarded and router in KEYED
        # the key first (a 401 whatever the path), then the ids of the path and the query values: not UTF-8 is a
        # 422, like an empty one. Only where a route reads them: POST /recommend, the hot path, checks neither.
        needs = ([Depends(require_key)] * keyed + [Depends(utf8_path)] * _takes_ids(router)
                 + [Depends(utf8_query)] * _takes_query(router))
        documented = recommend.guarded if guarded and router is recommend.router else router
        app.include_router(documented, dependencies=needs, responses=UNAUTHORIZED if keyed else None)
    app.mount("/static", StaticFiles(directory=web.STATIC), name="static")  # the page's scripts and styles
    return app


def _takes_ids(router: APIRouter) -> bool:
    """Whether a route of ``router`` has an id in its path (a ``{name:id}`` segment, `service.http.schemas`)."""
    return any(":id}" in getattr(route, "path", "") for route in router.routes)


def _takes_query(router: APIRouter) -> bool:
    """Whether a route of ``router`` reads query parameters (GET /items?query=...)."""
    return any(route.dependant.query_params for route in router.routes if isinstance(route, APIRoute))


@asynccontextmanager
async def lifespan(app: FastAPI, *, settings: Settings, metrics: Metrics,
                   preloaded: Bundle | None) -> AsyncIterator[None]:
    """Load the bundle (unless preloaded), start the engine and the history store; stop them at shutdown."""
    set_threads(settings.threads)
    if preloaded is None:
        path = resolve_bundle(settings.artifacts)
        served = await asyncio.to_thread(load_served, path, inference=settings.inference, threads=settings.threads)
    else:
        path, served = preloaded.path, preloaded
    engine = Engine(served, max_batch=settings.max_batch, max_wait_ms=settings.max_wait_ms,
                    max_queue=settings.max_queue, threads=settings.threads, concurrency=settings.concurrency,
                    personalize_beta=settings.personalize_beta,
                    personalize_steps=settings.personalize_steps, on_batch=metrics.batch.observe,
                    inference=settings.inference)
    await engine.start()
    store = make_store(settings)
    metrics.set_model(served)
    app.state.seqrec = State(settings, engine, store, metrics)
    log.info("serving %s (%s) from %s; history store: %s; inference: %s", served.version,
             served.ranker.kind if served.ranker else "no ranker", path, store.name, served.inference)
    poll = settings.reload_poll()
    watcher = asyncio.create_task(watch_current(app.state.seqrec, poll), name="seqrec-watch") if poll else None
    try:
        yield
    finally:
        if watcher is not None:
            watcher.cancel()
        await engine.stop()
        await store.close()


class _HeadAsGet:
    """HEAD answered as GET, without the body: RFC 9110 has a server that supports GET support HEAD, and
    FastAPI's routes take GET only, so `HEAD /healthz`, a load balancer's usual probe, was a 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class _Measured:
    """`Metrics.middleware` in the shape `add_middleware` takes (a class called with the next app)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.handle = metrics.middleware(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle(scope, receive, send)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with every field error on one line and as a list (`InvalidRequest`)."""
    errors = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        field, message = ".".join(loc) or "body", e.get("msg", "")
        if e.get("type") == "json_invalid":  # loc holds the character position, not a field
            field, message = "body", f"malformed JSON at character {loc[-1] if loc else 0}: " + str(
                e.get("ctx", {}).get("error", message))
        errors.append({"field": field, "message": message, "type": e.get("type")})
    message = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return JSONResponse({"detail": message, "errors": jsonable_encoder(errors)}, status_code=422)


async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if isinstance(exc.detail, str):  # a journal's OSError, a refused bundle's file: named, but not where it lives
        exc.detail = without_paths(exc.detail)
    if exc.status_code == 405:
        # Starlette lists only the methods of the first route matching the path; RFC 9110 wants them all.
        # Every route counts: the app's own (the docs, the static files: their 405s sent an empty Allow) and the
        # routers' (app.routes holds them wrapped); HEAD wherever GET is (`_HeadAsGet`).
        path = request.scope["path"]
        methods: set[str] = set()
        for route in [*request.app.routes, *(r for router in ROUTERS for r in router.routes)]:
            if isinstance(route, Mount) and path.startswith(route.path + "/"):
                methods |= {"GET"}  # StaticFiles
            elif isinstance(route, Route) and route.path_regex.match(path):
                methods |= set(route.methods or ())
        methods |= {"HEAD"} if "GET" in methods else set()
        exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
    return await http_exception_handler(request, exc)


async def overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    request.app.state.seqrec.metrics.shed.inc()
    return JSONResponse({"detail": f"overloaded, retry later: {exc}"}, status_code=503, headers={"Retry-After": "1"})


async def foreign_history(request: Request, exc: ForeignHistory) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=409)  # a retry cannot help, a DELETE of the history can


STORE_LOG_EVERY_S = 10.0  # an outage fails every request: one log line per worker this often, not one each
_store_logged = [float("-inf")]


async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
    """503 naming what Redis does (unreachable, refusing writes...), not where it is: the address goes to the log."""
    if time.monotonic() - _store_logged[0] >= STORE_LOG_EVERY_S:
        _store_logged[0] = time.monotonic()
        log.warning("history store unavailable: %s", exc)
    return JSONResponse({"detail": f"history store unavailable, retry later: {exc.public}"}, status_code=503,
                        headers={"Retry-After": "1"})
