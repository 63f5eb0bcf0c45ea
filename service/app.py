"""The HTTP service: ``POST /recommend`` and friends (OpenAPI at ``/docs``).

    python -m uvicorn service.app:create_app --factory --port 8000   (or `seqrec serve`)

Settings come from ``SEQREC_*`` environment variables (`service.settings.Settings`). Client
mistakes get a 4xx with a message naming the field; an unreachable Redis gets a 503 only where
the stored history is needed (`user_id`-only requests, events, history reads and deletes). ``GET /`` serves
a page to try the service in a browser (``service/static``, plain HTML and JS).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path as PathlibPath
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Request, Response, Security
from fastapi import Query as Param
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.pipeline import Bundle, BundleError, Engine, Query, load_bundle, resolve_bundle, set_threads
from service.schemas import (
    INVALID,
    MAX_QUERY,
    METRICS,
    REFUSED,
    STORE_DOWN,
    TOO_LARGE,
    UNAUTHORIZED,
    UNKNOWN_ITEM,
    UNREADABLE,
    DeleteResponse,
    EventBatch,
    EventIn,
    EventsResponse,
    HistoryResponse,
    ItemResponse,
    RecommendRequest,
    RecommendResponse,
    ReloadResponse,
    Responses,
    SearchResponse,
)
from service.settings import Settings
from service.store import Event, HistoryStore, StoreUnavailable, make_store

log = logging.getLogger("seqrec.service")
STATIC = PathlibPath(__file__).parent / "static"  # the try-it page served at /
SEARCH = "an item id, an id prefix or part of a title (case-insensitive); empty: the most popular items"

class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
        self.requests = Counter("seqrec_requests_total", "HTTP requests", ["route", "method", "status"],
                                registry=self.registry)
        self.latency = Histogram("seqrec_request_seconds", "HTTP request latency", ["route", "method"],
                                 buckets=buckets, registry=self.registry)
        self.stages = Histogram("seqrec_stage_seconds", "recommendation stage latency", ["stage"],
                                buckets=buckets, registry=self.registry)
        self.batch = Histogram("seqrec_batch_size", "requests per forward pass",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=self.registry)
        self.model = Gauge("seqrec_model_info", "the served model (value 1)", ["version", "ranker"],
                           registry=self.registry)
        self.reloads = Counter("seqrec_reloads_total", "bundle reloads", ["result"], registry=self.registry)
        self.fallbacks = Counter("seqrec_fallbacks_total", "answers without a usable history", ["kind"],
                                 registry=self.registry)

    def set_model(self, bundle: Bundle) -> None:
        self.model.clear()
        self.model.labels(bundle.version, bundle.ranker.kind if bundle.ranker else "none").set(1)


class State:
    """What the routes share: settings, engine, store, metrics."""

    def __init__(self, settings: Settings, engine: Engine, store: HistoryStore, metrics: Metrics) -> None:
        self.settings, self.engine, self.store, self.metrics = settings, engine, store, metrics


def _state(request: Request) -> State:
    state: State = request.app.state.seqrec
    return state


StateDep = Annotated[State, Depends(_state)]
# Declared in the OpenAPI document as the security scheme of the write routes; `require_key` checks it.
BearerDep = Annotated[HTTPAuthorizationCredentials | None,
                      Security(HTTPBearer(auto_error=False, description="SEQREC_API_KEY, needed on writes and /admin "
                                                                        "when the service has one"))]


def create_app(settings: Settings | None = None, *, bundle: Bundle | None = None) -> FastAPI:
    """The app; the bundle (unless given, already loaded) is loaded in the lifespan, and a bundle
    that fails to load stops the start-up."""
    settings = settings or Settings()
    metrics = Metrics()
    preloaded = bundle

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        set_threads(settings.threads)
        if preloaded is None:
            path = resolve_bundle(settings.artifacts)
            served = await asyncio.to_thread(load_bundle, path)
        else:
            path, served = preloaded.path, preloaded
        engine = Engine(served, max_batch=settings.max_batch, max_wait_ms=settings.max_wait_ms,
                        threads=settings.threads, personalize_beta=settings.personalize_beta,
                        personalize_steps=settings.personalize_steps, on_batch=metrics.batch.observe)
        await engine.start()
        store = make_store(settings)
        metrics.set_model(served)
        app.state.seqrec = State(settings, engine, store, metrics)
        log.info("serving %s (%s) from %s; history store: %s", served.version,
                 served.ranker.kind if served.ranker else "no ranker", path, store.name)
        try:
            yield
        finally:
            await engine.stop()
            await store.close()

    app = FastAPI(title="seqrec", version="0.1.0", lifespan=lifespan, max_body_size=settings.max_body_bytes,
                  description="Two-stage sequential recommendations: retrieval over a FAISS index, then reranking.")

    key = settings.api_key_value()
    key_bytes = (key or "").encode()

    async def require_key(credentials: BearerDep) -> None:
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), key_bytes):
            raise HTTPException(401, "this endpoint needs `Authorization: Bearer <SEQREC_API_KEY>`",
                                headers={"WWW-Authenticate": "Bearer"})

    # Without a key, writes are open, and the OpenAPI document says so (no security scheme, no 401).
    Writer = [Depends(require_key)] if key is not None else []
    unauthorized: Responses = UNAUTHORIZED if key is not None else {}

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
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

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette lists only the methods of the first route matching the path; RFC 9110 wants them all.
            path = request.scope["path"]
            methods = {m for r in request.app.router.routes if isinstance(r, APIRoute) and r.path_regex.match(path)
                       for m in r.methods or ()}
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": f"history store unavailable, retry later: {exc}"}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            name = getattr(route, "path_format", "unmatched")  # "/users/{user_id}/history", convertor-free
            metrics.requests.labels(name, request.method, str(status)).inc()
            metrics.latency.labels(name, request.method).observe(time.perf_counter() - start)

    @app.post("/recommend", response_model=RecommendResponse,
              responses={**UNREADABLE, **INVALID, **TOO_LARGE,
                         503: {**STORE_DOWN[503], "description": "user_id-only request while the history store "
                                                                  "is unreachable"}})
    async def recommend(body: RecommendRequest, s: StateDep) -> dict[str, Any]:
        start = time.perf_counter()
        bundle = s.engine.bundle
        if body.history is not None:
            raw = list(body.history)
        elif body.user_id is not None:
            raw = [e.item_id for e in await s.store.history(body.user_id)]
        else:
            raw = []
        known = [bundle.index_of.get(i) for i in raw]
        unknown = list(dict.fromkeys(i for i, j in zip(raw, known, strict=True) if j is None))
        history = [j for j in known if j is not None]
        used = history[-bundle.max_len :]
        if body.personalize and not getattr(bundle.artifact.model.encoder, "causal", True):
            backbone = bundle.artifact.manifest.get("backbone")
            raise RequestValidationError([{"loc": ("body", "personalize"), "type": "value_error",
                                           "msg": f"needs a causal model; this bundle's backbone is {backbone}"}])
        if not used:
            s.metrics.fallbacks.labels("popularity").inc()
            seen = set(history) if body.exclude_seen else set()
            top = [i for i in bundle.popular[: body.k + len(seen)].tolist() if i not in seen][: body.k]
            items = [_item(bundle, i, float(bundle.popularity[i]), 0.0, r + 1) for r, i in enumerate(top)]
            total = 1000 * (time.perf_counter() - start)
            return {"items": items, "model_version": bundle.version, "reranked": False, "unknown_items": unknown,
                    "fallback": "popularity", "history_used": 0,
                    "timing_ms": {"queue": 0.0, "encode": 0.0, "search": 0.0, "rerank": 0.0, "total": total}}
        query = Query(used, k=body.k, candidates=body.candidates, exclude_seen=body.exclude_seen,
                      rerank=body.rerank, personalize=body.personalize,
                      exclude=tuple(history[: -bundle.max_len]) if body.exclude_seen else ())
        queued = time.perf_counter()
        result = await s.engine.recommend(query, bundle)  # the bundle the ids were mapped with
        total = 1000 * (time.perf_counter() - start)
        compute = sum(result.timing_ms.values())
        for stage, ms in result.timing_ms.items():
            s.metrics.stages.labels(stage).observe(ms / 1000)
        items = [_item(result.bundle, i, score, retrieval, r + 1)
                 for r, (i, score, retrieval) in enumerate(result.items)]
        return {"items": items, "model_version": result.version, "reranked": result.reranked,
                "unknown_items": unknown, "fallback": None, "history_used": len(used),
                "timing_ms": {"queue": max(0.0, 1000 * (time.perf_counter() - queued) - compute),
                              **result.timing_ms, "total": total}}

    @app.post("/events", response_model=EventsResponse, dependencies=Writer,
              responses={**unauthorized, **UNREADABLE, **INVALID, **TOO_LARGE, **STORE_DOWN})
    async def events(body: EventIn | EventBatch, s: StateDep) -> dict[str, Any]:
        batch = body.events if isinstance(body, EventBatch) else [body]
        per_user: dict[str, list[Event]] = {}
        for e in batch:
            per_user.setdefault(e.user_id, []).append(Event(e.item_id, e.timestamp))
        bundle = s.engine.bundle
        if len(per_user) == 1:
            ((user, evs),) = per_user.items()
            await s.store.append(user, evs, bundle.max_len)
        else:
            await s.store.append_many(list(per_user.items()), bundle.max_len)
        unknown = list(dict.fromkeys(e.item_id for e in batch if e.item_id not in bundle.index_of))
        return {"stored": len(batch), "users": len(per_user), "unknown_items": unknown}

    @app.get("/users/{user_id:id}/history", response_model=HistoryResponse, response_model_exclude_none=True,
             responses={**INVALID, **STORE_DOWN})
    async def get_history(user_id: Annotated[str, Path(min_length=1, max_length=256)], s: StateDep) -> dict[str, Any]:
        events = await s.store.history(user_id)
        return {"user_id": user_id, "items": [{"item_id": e.item_id, "timestamp": e.timestamp} for e in events]}

    @app.delete("/users/{user_id:id}/history", response_model=DeleteResponse, dependencies=Writer,
                responses={**unauthorized, **INVALID, **STORE_DOWN})
    async def delete_history(user_id: Annotated[str, Path(min_length=1, max_length=256)],
                             s: StateDep) -> dict[str, Any]:
        return {"user_id": user_id, "deleted": await s.store.delete(user_id)}

    @app.get("/items", response_model=SearchResponse, response_model_exclude_none=True, responses=INVALID)
    async def find_items(s: StateDep, query: Annotated[str, Param(max_length=MAX_QUERY, description=SEARCH)] = "",
                         limit: Annotated[int, Param(ge=1, le=100)] = 20) -> dict[str, Any]:
        bundle = s.engine.bundle
        found, more = bundle.find(query, limit)
        items = [{"item_id": bundle.external(i), "popularity_rank": int(bundle.popularity_rank[i]),
                  **bundle.metadata[i - 1]} for i in found]
        return {"query": query, "items": items, "more": more}

    @app.get("/items/{item_id:id}", response_model=ItemResponse, response_model_exclude_none=True,
             responses={**UNKNOWN_ITEM, **INVALID})
    async def get_item(item_id: Annotated[str, Path(min_length=1, max_length=256)], s: StateDep) -> dict[str, Any]:
        bundle = s.engine.bundle
        internal = bundle.index_of.get(item_id)
        if internal is None:
            raise HTTPException(404, f"item {item_id!r} is not in the catalogue of model {bundle.version}")
        return {"item_id": item_id, **bundle.metadata[internal - 1]}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz(s: StateDep) -> dict[str, Any]:
        reachable = await s.store.ping()
        return {"status": "ready" if reachable else "degraded", **s.engine.bundle.describe(),
                "store": {"kind": s.store.name, "reachable": reachable}}

    @app.get("/metrics", response_class=Response, responses=METRICS)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/reload", response_model=ReloadResponse, dependencies=Writer,
              responses={**unauthorized, **REFUSED, **TOO_LARGE})
    async def reload(s: StateDep) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            path = resolve_bundle(s.settings.artifacts)
            current = s.engine.bundle
            if path == current.path and _same_manifest(current):
                return {"status": "unchanged", "model_version": current.version, "previous_version": current.version,
                        "seconds": round(time.perf_counter() - start, 3)}
            old, new = await s.engine.reload(path)
        except BundleError as err:
            s.metrics.reloads.labels("refused").inc()
            log.warning("reload refused: %s", err)
            raise HTTPException(409, f"bundle refused, still serving {s.engine.bundle.version}: {err}") from None
        s.metrics.reloads.labels("ok").inc()
        s.metrics.set_model(new)
        log.info("reloaded: %s -> %s", old.version, new.version)
        return {"status": "reloaded", "model_version": new.version, "previous_version": old.version,
                "seconds": round(time.perf_counter() - start, 3)}

    return app


def _same_manifest(bundle: Bundle) -> bool:
    try:
        return bool(json.loads((bundle.path / "manifest.json").read_text()) == bundle.artifact.manifest)
    except (OSError, ValueError):
        return False


def _item(bundle: Bundle, internal: int, score: float, retrieval: float, rank: int) -> dict[str, Any]:
    return {"item_id": bundle.external(internal), "score": score, "retrieval_score": retrieval, "rank": rank,
            **bundle.metadata[internal - 1]}
