"""What keeps one client from holding the service: a Host allow-list, a request-read deadline, a connection cap.

- `AllowedHosts` (ASGI middleware): a request whose Host header is not in ``SEQREC_ALLOWED_HOSTS`` gets 400. A
  key-less server on a loopback address answers its localhost names only, so a web page whose name an attacker
  points at 127.0.0.1 (DNS rebinding) cannot drive it from a visitor's browser.
- The read deadline (uvicorn protocols): a connection has ``SEQREC_REQUEST_READ_TIMEOUT_S`` seconds from its
  opening, and from each further request's first byte, to send the request line, the headers and the whole body;
  past them it gets 408 (or, once an answer has started, is closed). uvicorn's own keep-alive timer restarts on
  every byte, so a client trickling one byte every 1.5 s held a connection forever.
- The connection cap: uvicorn's ``limit_concurrency`` (``SEQREC_MAX_CONNECTIONS``), set by `guarded_config`: a
  request that arrives while the worker holds that many connections (or tasks) gets 503. Without the deadline,
  connections that never finish a request would fill it for good.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.http.settings import Settings

log = logging.getLogger("seqrec.service")
DEFAULT_READ_TIMEOUT_S = Settings.model_fields["request_read_timeout_s"].default


# --------------------------------------------------------------------------- Host allow-list


def host_name(header: str) -> str:
    """The name of a Host header, lower case and without its port: ``[::1]:8000`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(entry == "*" or entry == name or (entry.startswith("*.") and name.endswith(entry[1:]))
               for entry in allowed)


class AllowedHosts:
    """400 for a request whose Host header names a host not in ``allowed`` (``("*",)`` lets every one through)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app, self.allowed = app, allowed
        self.open = "*" in allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.open or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        name = host_name(headers.get(b"host", b"").decode("latin-1"))
        if host_allowed(name, self.allowed):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": f"the Host header {name!r} is not one this server answers "
                                     "(SEQREC_ALLOWED_HOSTS)"}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# an absolute path's folders, where a path starts (after a space, a quote, a parenthesis or "="): not a URL's
_FOLDERS = re.compile(r"(?:(?<=^)|(?<=[\s'\"(=]))/(?:[^/\s'\"]+/)*")


def without_paths(text: str) -> str:
    """``text`` with the folders of every absolute path left out (``/artifacts/versions/v1/x.json`` -> ``x.json``):
    an answer tells a client what failed, not where this server keeps its files."""
    return _FOLDERS.sub("", text)


# --------------------------------------------------------------------------- read deadline


def timeout_response(seconds: float) -> bytes:
    body = json.dumps({"detail": f"request not received in time: its line, headers and body must arrive within "
                                 f"{seconds:g} s (SEQREC_REQUEST_READ_TIMEOUT_S)"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _ReadDeadline(asyncio.Protocol):
    """The deadline, over either of uvicorn's HTTP/1.1 protocols (their ``cycle``, ``transport`` and ``loop``): armed
    when a connection opens and when a request's first byte arrives, disarmed once the request is whole."""

    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None
    _read_timer: asyncio.TimerHandle | None = None

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self.read_timeout_s: float = getattr(config, "read_timeout_s", DEFAULT_READ_TIMEOUT_S)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read()
        super().connection_lost(exc)

    def _arm_read(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_expired)

    def _disarm_read(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _read_expired(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        answering = self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        if not answering:
            self.transport.write(timeout_response(self.read_timeout_s))
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("closed the connection of %s: its request was not received within %g s "
                 "(SEQREC_REQUEST_READ_TIMEOUT_S)", client, self.read_timeout_s)
        self.transport.close()


class DeadlineH11Protocol(_ReadDeadline, H11Protocol):
    """uvicorn's h11 protocol with the read deadline."""

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._arm_read()
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm_read()


try:  # uvicorn's faster parser, which its [standard] extra (a seqrec dependency) installs
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - uvicorn installed without it: h11, as uvicorn itself falls back
    GUARDED_HTTP = "service.http.guards:DeadlineH11Protocol"
else:
    GUARDED_HTTP = "service.http.guards:DeadlineHttpToolsProtocol"  # an import string: workers are spawned

    class DeadlineHttpToolsProtocol(_ReadDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol (its default when httptools is installed) with the read deadline."""

        def on_message_begin(self) -> None:
            self._arm_read()
            super().on_message_begin()

        def on_message_complete(self) -> None:
            self._disarm_read()
            super().on_message_complete()


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with the read deadline beside it (a module-level class: it pickles into workers);
    the protocol is the deadline's over httptools (else h11) unless ``http`` names another."""

    def __init__(self, app: Any, *, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(app, **{"http": GUARDED_HTTP, **kwargs})
        self.read_timeout_s = read_timeout_s


def guarded_config(app: Any, settings: Settings, **kwargs: Any) -> GuardedConfig:
    """The uvicorn configuration `seqrec serve` runs: address, deadline, connection cap and every worker's logging."""
    from service.http.logs import log_config

    return GuardedConfig(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                         read_timeout_s=settings.request_read_timeout_s, limit_concurrency=settings.max_connections,
                         log_config=log_config(settings.log_format, settings.log_level), **kwargs)
