"""The Prometheus metrics of one app (``GET /metrics``) and the middleware that counts every request."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common import seqrec_version
from service.system.bundle import Bundle

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("seqrec_requests_total", "HTTP requests", ["route", "method", "status"],
                                registry=self.registry)
        self.latency = Histogram("seqrec_request_seconds", "HTTP request latency", ["route", "method"],
                                 buckets=BUCKETS, registry=self.registry)
        self.stages = Histogram("seqrec_stage_seconds", "recommendation stage latency", ["stage"],
                                buckets=BUCKETS, registry=self.registry)
        self.batch = Histogram("seqrec_batch_size", "requests per forward pass",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=self.registry)
        self.model = Gauge("seqrec_model_info", "the served model (value 1)", ["version", "ranker"],
                           registry=self.registry)
        Gauge("seqrec_build_info", "the seqrec release serving (value 1)", ["version"],
              registry=self.registry).labels(seqrec_version()).set(1)
        self.reloads = Counter("seqrec_reloads_total", "bundle reloads", ["result"], registry=self.registry)
        self.shed = Counter("seqrec_shed_total", "/recommend requests refused with 503 because the queue was full",
                            registry=self.registry)
        self.fallbacks = Counter("seqrec_fallbacks_total", "answers without a usable history", ["kind"],
                                 registry=self.registry)

    def set_model(self, bundle: Bundle) -> None:
        self.model.clear()
        self.model.labels(bundle.version, bundle.ranker.kind if bundle.ranker else "none").set(1)

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """A pure ASGI middleware that counts and times every HTTP request under its route's path template
        (Starlette's BaseHTTPMiddleware costs a task and a stream per request)."""

        async def measured(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            start = time.perf_counter()
            status = 500

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                route = scope.get("route")
                name = getattr(route, "path_format", "unmatched")  # "/users/{user_id}/history", convertor-free
                self.requests.labels(name, scope["method"], str(status)).inc()
                self.latency.labels(name, scope["method"]).observe(time.perf_counter() - start)

        return measured
