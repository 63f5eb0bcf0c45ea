"""Service settings: environment variables with the ``SEQREC_`` prefix (or a ``.env`` file).

    SEQREC_ARTIFACTS=artifacts        folder whose ``current`` names the bundle to serve
                                      (or a bundle folder itself)
    SEQREC_REDIS_URL=redis://redis:6379/0   history store; unset = the in-process store
                                      (redis+cluster://host:port: a Redis Cluster, through any one node)
    SEQREC_REDIS_WAIT_REPLICAS=0      replicas that must confirm each append (WAIT) before it is acknowledged
    SEQREC_SEEN_CAP=10000             items remembered per user for ``exclude_seen`` (see ``service.http.store``)
    SEQREC_API_KEY=...                required as ``Authorization: Bearer`` on writes, /admin,
                                      GET /users/{id}/history and POST /recommend with a user_id
                                      (printable ASCII: ! to ~, at least 16 characters)
    SEQREC_API_KEY_FILE=/run/secrets/api_key   the key read from a file at start (one of the two)
    SEQREC_INSECURE_NO_KEY=1          serve without a key on a non-loopback host (open to anyone who reaches it)
    SEQREC_ALLOWED_HOSTS=a,b          Host headers answered (else 400); default: localhost names for a key-less
                                      loopback server, else any
    SEQREC_REQUEST_READ_TIMEOUT_S=10  a request's line, headers and body must arrive within this (else 408)
    SEQREC_MAX_CONNECTIONS=1024       connections per worker; a request past them gets 503
    SEQREC_LOG_FORMAT=text            text | json: every worker's log lines (level, logger, pid)
    SEQREC_INFERENCE=auto             auto | onnx | eager: the encoder and MLP ranker through ONNX Runtime
    SEQREC_WORKERS=N                  worker processes (default: one per core with Redis, else 1)
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.redis_url import check_redis_url

# Items remembered per user for `exclude_seen`. Above every user's count of distinct items in our datasets
# (the longest: 737 in MovieLens-100K, 204 in Amazon Beauty), so no user of theirs reaches it; a user who does
# is most likely a crawler. The cap bounds what one such user can make the store hold.
DEFAULT_SEEN_CAP = 10_000


# what redis-py's from_url accepts, and a Redis Cluster's seed node (`common.redis_url.cluster_node_url`)
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
MIN_POLL_S = 0.1
MIN_KEY_LENGTH = 16  # a one-character key was accepted; 16 printable characters are ~100 bits when random
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")  # the Host headers a key-less loopback server answers




def default_workers(redis_url: str | None) -> int:
    """One worker per core this process may run on when histories are shared through Redis; else 1."""
    return max(1, min(len(os.sched_getaffinity(0)), 8)) if redis_url else 1


class Settings(BaseSettings):
    # An empty variable is an unset one (compose passes unset ones empty): SEQREC_HOST= listened on every interface.
    # A refused value stays out of the error (a worker logs it): it may be the API key or a Redis password.
    model_config = SettingsConfigDict(env_prefix="SEQREC_", env_file=".env", extra="ignore", env_ignore_empty=True,
                                      hide_input_in_errors=True)

    artifacts: Path = Field(Path("artifacts"), description="artifacts folder (its `current`) or a bundle folder")
    redis_url: str | None = Field(None, description="redis://host:port/db; unset = in-process history store")
    redis_prefix: str = Field("seqrec:", description="prefix of every Redis key the service writes")
    redis_timeout_ms: float = Field(250.0, gt=0, description="connect and command timeout")
    redis_pool_size: int = Field(64, ge=1, description="connections in the Redis pool")
    redis_wait_replicas: int = Field(0, ge=0, le=16, description="replicas that must confirm each append (Redis "
                                     "WAIT) before it is acknowledged, else 503; 0 = acknowledged once the master "
                                     "has it")
    redis_wait_ms: int = Field(100, ge=1, le=10_000, description="how long an append waits for those replicas")
    seen_cap: int = Field(DEFAULT_SEEN_CAP, ge=1, description="items remembered per user for `exclude_seen`; past "
                          "it the least recently recorded are forgotten")
    api_key: SecretStr | None = Field(None, description="when set, writes, /admin, GET /users/{id}/history and "
                                      "POST /recommend with a user_id need `Bearer <key>`; printable ASCII (! to "
                                      "~), as a header carries it")
    api_key_file: Path | None = Field(None, description="a file holding the API key (its last line break "
                                      "ignored), read at start; set it or SEQREC_API_KEY, not both")
    insecure_no_key: bool = Field(False, description="serve without an API key on a non-loopback host: every "
                                  "write and /admin route is then open to anyone who can reach the port")
    allowed_hosts: str | None = Field(None, description="comma-separated Host header names answered (`*` any, "
                                      "`*.example.com` a domain's); other Host headers get 400 (DNS rebinding). "
                                      "Default: localhost, 127.0.0.1 and [::1] for a key-less server on a "
                                      "loopback address, else any")
    request_read_timeout_s: float = Field(10.0, gt=0, le=3600, description="seconds a connection has to send a "
                                          "request's line, headers and body (from its first byte, or from the "
                                          "connection's opening); past them it gets 408 and is closed")
    max_connections: int = Field(1024, ge=1, le=1_000_000, description="open connections per worker; a request "
                                 "arriving past them gets 503 (uvicorn's limit_concurrency)")
    log_format: Literal["text", "json"] = Field("text", description="every worker's log lines: text (time, level, "
                                                "logger, pid, message) or one JSON object per line")
    max_batch: int = Field(32, ge=1, le=1024, description="requests micro-batched into one forward pass")
    max_wait_ms: float = Field(0.0, ge=0, le=1000, description="extra wait for more requests before a batch "
                               "runs; 0 = adaptive: a batch holds what queued while the last one ran")
    max_queue: int = Field(256, ge=1, le=1_000_000, description="requests waiting for the model; past it "
                           "/recommend answers 503 with Retry-After at once instead of queueing (load shedding)")
    threads: int = Field(1, ge=1, le=256, description="torch, ONNX Runtime and FAISS threads for inference")
    concurrency: int = Field(1, ge=1, le=64, description="batches the model runs at once, each on an inference "
                             "thread of its own: a request that arrives while a batch runs starts at once on "
                             "another instead of waiting for it")
    inference: Literal["auto", "onnx", "eager"] = Field(
        "auto", description="auto: the encoder and the MLP ranker run compiled (ONNX Runtime) when they export "
        "and match eager at load, else eagerly (logged), and a LightGBM ranker's trees compiled by lleaves; onnx: "
        "refuse a bundle whose encoder or MLP does not compile; eager: never compile")
    personalize_beta: float = Field(1e-5, ge=0, le=1, description="PCRec-simple step size (`personalize: true`)")
    personalize_steps: int = Field(1, ge=0, le=10, description="PCRec-simple gradient steps per request")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies get 413")
    host: str = Field("127.0.0.1", description="the address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="the port to listen on")
    workers: int = Field(default_factory=lambda data: default_workers(data.get("redis_url")), ge=1, le=64,
                         description="uvicorn worker processes; default: one per core with Redis, else 1 (the "
                                     "in-process history store is per process)")
    reload_poll_s: float | None = Field(None, ge=0, le=3600, description="seconds between each worker's checks "
                                        "of `current` (0 = never, else at least 0.1); default: 2 with several "
                                        "workers, else 0")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        "info", description="uvicorn's log level")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, level: object) -> object:
        return level.lower() if isinstance(level, str) else level  # LOG_LEVEL=INFO as well as info

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        # redis-py's own check only runs when the store connects, inside each worker's start-up
        if not url:
            return url
        shown = url if "@" not in url else "***@" + url.rsplit("@", 1)[1]  # credentials never reach a log
        if not url.startswith(REDIS_SCHEMES):
            raise ValueError(f"{shown!r} is not a Redis URL: it must start with {', '.join(REDIS_SCHEMES)}")
        return check_redis_url(url, cluster=True)

    @field_validator("host", "artifacts", mode="before")
    @classmethod
    def _not_empty(cls, value: object) -> object:  # --host '' listened on every interface; --artifacts= was "."
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty; leave it out for the default")
        return value

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, key: SecretStr | None) -> SecretStr | None:
        check_key(None if key is None else key.get_secret_value())
        return key

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_format(cls, fmt: object) -> object:
        return fmt.lower() if isinstance(fmt, str) else fmt

    @model_validator(mode="after")
    def _keyed_or_local(self) -> Settings:
        self._key_from_file()
        if self.api_key_value() is None and not self.insecure_no_key and not is_loopback(self.host):
            raise ValueError(open_message(self.host))
        return self

    def _key_from_file(self) -> None:
        if self.api_key_file is None:
            return
        if self.api_key_value() is not None:
            raise ValueError("SEQREC_API_KEY and SEQREC_API_KEY_FILE are both set; set one")
        try:
            text = self.api_key_file.read_text(encoding="ascii").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError) as err:
            reason = "not ASCII text" if isinstance(err, UnicodeDecodeError) else err.strerror or type(err).__name__
            raise ValueError(f"SEQREC_API_KEY_FILE: cannot read {self.api_key_file}: {reason}") from None
        try:
            check_key(text)
        except ValueError as err:
            raise ValueError(f"SEQREC_API_KEY_FILE: the key in {self.api_key_file} {err}") from None
        if not text:
            raise ValueError(f"SEQREC_API_KEY_FILE: {self.api_key_file} is empty")
        self.api_key = SecretStr(text)

    @field_validator("reload_poll_s")
    @classmethod
    def _poll_off_or_sane(cls, seconds: float | None) -> float | None:
        if seconds is not None and 0 < seconds < MIN_POLL_S:  # 1e-6 kept an idle server's core busy
            raise ValueError(f"must be 0 (never) or at least {MIN_POLL_S}, got {seconds:g}")
        return seconds

    def reload_poll(self) -> float:
        return (2.0 if self.workers > 1 else 0.0) if self.reload_poll_s is None else self.reload_poll_s

    def host_allow_list(self) -> tuple[str, ...]:
        """The Host header names answered (lower case, no port); ``("*",)`` answers any."""
        if self.allowed_hosts is not None and self.allowed_hosts.strip():
            return tuple(name.strip().lower() for name in self.allowed_hosts.split(",") if name.strip())
        return LOOPBACK_NAMES if self.api_key_value() is None and is_loopback(self.host) else ("*",)

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None and self.api_key.get_secret_value() else None


def check_key(text: str | None) -> None:
    """ValueError unless ``text`` (when set) is a key an Authorization header carries as the same text from every
    client, and long enough; the characters themselves stay out of the message."""
    if text and text != text.strip():  # HTTP strips a header value's ends: no request could carry this key
        raise ValueError("starts or ends with white space, which an Authorization header cannot carry")
    if text and not all("!" <= c <= "~" for c in text):
        # 'clé': curl sends its UTF-8 bytes, the server reads a header as Latin-1, browsers refuse to send it
        raise ValueError("has a character that is not printable ASCII (! to ~; no spaces), which an "
                         "Authorization header cannot carry as the same text from every client")
    if text and len(text) < MIN_KEY_LENGTH:
        raise ValueError(f"is {len(text)} characters long; an API key needs at least {MIN_KEY_LENGTH} (e.g. "
                         "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name to listen on) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def open_message(host: str) -> str:
    """Why a key-less server on ``host`` does not start, and the ways out."""
    return (f"refusing to listen on {host} without an API key: every write and /admin route would be open to "
            "anyone who can reach the port. Set SEQREC_API_KEY (at least 16 printable characters, e.g. `python -c "
            "'import secrets; print(secrets.token_urlsafe(32))'`) or SEQREC_API_KEY_FILE (a file holding it), "
            "listen on 127.0.0.1, or pass --insecure-no-key (SEQREC_INSECURE_NO_KEY=1) to serve it open on purpose")
