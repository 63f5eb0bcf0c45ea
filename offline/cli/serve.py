"""`seqrec serve`: the HTTP service on a published bundle."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import SeqrecError
from offline.cli.common import Subparsers

if TYPE_CHECKING:
    from pydantic import ValidationError

    from service.http.settings import Settings

log = logging.getLogger("seqrec")


def add_serve_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve", parents=[common], help="serve recommendations over HTTP (POST /recommend; docs at /docs)",
        description="Start the HTTP service on the bundle ARTIFACTS/current names (or on a bundle folder). "
        "Every option falls back to its SEQREC_* environment variable (SEQREC_REDIS_URL, SEQREC_API_KEY, "
        "...; see service/http/settings.py); without a Redis URL, histories live in an in-process store.",
    )
    p.add_argument("--artifacts", type=Path, default=None, help="artifacts folder or bundle (SEQREC_ARTIFACTS)")
    p.add_argument("--host", default=None, help="interface to bind (SEQREC_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (SEQREC_PORT, default 8000)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (SEQREC_WORKERS; default: one per core, at most 8, with --redis-url, else 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (SEQREC_THREADS)")
    p.add_argument("--redis-url", default=None, help="history store, e.g. redis://localhost:6379/0")
    p.add_argument("--max-batch", type=int, default=None, help="requests per forward pass (SEQREC_MAX_BATCH)")
    p.add_argument("--max-wait-ms", type=float, default=None, help="micro-batch wait (SEQREC_MAX_WAIT_MS)")
    p.add_argument("--insecure-no-key", action="store_true", default=None,
                   help="serve without an API key on a non-loopback --host: every write and /admin route is then "
                   "open to anyone who reaches the port (SEQREC_INSECURE_NO_KEY); without it such a server refuses "
                   "to start")
    p.set_defaults(handler=_serve)


def settings_message(err: ValidationError, flags: dict[str, object]) -> str:
    """One line for invalid settings, each named as the user gave it: ``--workers`` for a flag (it was named
    SEQREC_WORKERS, a variable they never set), ``SEQREC_...`` for a variable or .env line."""
    problems = []
    for error in err.errors():
        if error["type"] == "default_factory_not_called":  # a consequence of another error, listed beside it
            continue
        field = str(error["loc"][0]) if error["loc"] else ""
        if not field:  # a check of several settings (the key and the host): its message names them
            problems.append(error["msg"].removeprefix("Value error, "))
            continue
        problems.append(f"{'--' + field.replace('_', '-') if field in flags else 'SEQREC_' + field.upper()}: "
                        f"{error['msg']}")
    return "; ".join(problems)


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from service.http.server import serve_one, serve_workers
    from service.http.settings import Settings
    from service.system.bundle import BundleError
    from service.system.catalog import load_served
    from service.system.loader import resolve_bundle

    given = {name: getattr(args, name) for name in ("artifacts", "host", "port", "workers", "threads", "redis_url",
                                                    "max_batch", "max_wait_ms", "insecure_no_key")}
    given = {name: value for name, value in given.items() if value is not None}
    try:
        settings = Settings(**given)  # options override SEQREC_* variables
    except ValidationError as err:
        raise SeqrecError("invalid settings: " + settings_message(err, given)) from None
    except UnicodeDecodeError as err:  # the .env file pydantic-settings reads
        raise SeqrecError(f".env: not UTF-8 text (byte {err.start}); write it as UTF-8") from None
    check_bindable(settings.host, settings.port)  # before the bundle's load, which takes seconds
    if settings.redis_url:
        check_redis(settings.redis_url, settings.redis_prefix)
    try:  # refuse a bad bundle before binding; with several workers each loads its own, so this one is dropped
        path = resolve_bundle(settings.artifacts)
        bundle = load_served(path, inference=settings.inference, threads=settings.threads)
    except BundleError as err:
        raise SeqrecError(str(err)) from None
    configure_service_logging(settings)  # this process's lines in the workers' format (SEQREC_LOG_FORMAT)
    log.info("serving %s on http://%s:%d (docs at /docs)", path, settings.host, settings.port)
    if settings.workers == 1:
        serve_one(settings, bundle)
        return 0
    del bundle
    for name, value in given.items():  # worker processes read their settings from the environment
        os.environ[f"SEQREC_{name.upper()}"] = str(value)
    serve_workers(settings)
    return 0


def configure_service_logging(settings: Settings) -> None:
    import logging.config

    from service.http.logs import log_config

    logging.config.dictConfig(log_config(settings.log_format, settings.log_level))


def check_bindable(host: str, port: int, options: str = "--host/--port, SEQREC_HOST/SEQREC_PORT") -> None:
    """Bind HOST:PORT as uvicorn will (SO_REUSEADDR) and let go: a port in use, a host this machine does not have
    or a privileged port is one line now, instead of uvicorn's exit 3 once the bundle has loaded."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family=family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise SeqrecError(f"cannot listen on {host}:{port}: {err.strerror or err} ({options})") from None


def check_redis(url: str, prefix: str) -> None:
    """A Redis that refuses this server's configuration (password, database number, ACL) is one line before
    anything starts; one that is down or full only for now is a warning, and the service starts without it."""
    from common.redis_url import redact_url
    from service.http.redis_errors import refused_configuration

    problem = refused_configuration(url, prefix)
    if problem is not None:
        raise SeqrecError(f"Redis at {redact_url(url)} refuses this server: {problem} (--redis-url, "
                          "SEQREC_REDIS_URL, SEQREC_REDIS_PREFIX)")

