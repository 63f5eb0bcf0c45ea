"""Users' interaction histories behind ``POST /events``, ``/users/{id}/history`` and user_id-only ``/recommend``.

Two stores share one protocol:

- ``RedisStore``: one Redis list per user (``{prefix}history:{user_id}``), each entry a compact JSON object
  ``{"i": item_id, "t": timestamp}`` (``"t"`` left out when there is none). An append is RPUSH + LTRIM in one
  MULTI/EXEC transaction, so one round trip, and concurrent appends never leave a list longer than ``max_len``.
- ``MemoryStore``: the in-process default when no Redis URL is configured (one process, lost on restart).

Any failure to reach Redis (refused, reset, timeout, still loading its dataset, out of pooled connections)
becomes ``StoreUnavailable``, which the API answers with 503 so clients retry; an event is never dropped
silently. The client keeps no long retry loop: a down Redis fails within about ``redis_timeout_ms``, and the
pool reconnects by itself on the next call once Redis is back.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from retriever.errors import SeqrecError
from service.settings import Settings

log = logging.getLogger(__name__)

# Errors that mean "the store cannot serve right now, try again later", as opposed to a bug or bad data.
# ConnectionError covers refused/reset sockets, BusyLoadingError, MaxConnectionsError and the blocking pool's
# "No connection available"; OSError covers socket errors redis-py lets through (and builtin TimeoutError).
# A Redis that refuses writes (replica, maxmemory reached) is also a "retry later" for the client.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.ReadOnlyError,
    rex.OutOfMemoryError,
    OSError,
)


class StoreUnavailable(SeqrecError):
    """The history store cannot be reached (down, timing out, loading); the API maps it to 503."""


@dataclass(frozen=True)
class Event:
    item_id: str  # the catalogue's external id, as a string
    timestamp: float | None = None  # unix seconds

    def __post_init__(self) -> None:
        if not isinstance(self.item_id, str) or not self.item_id:
            raise ValueError(f"item_id must be a non-empty string, got {self.item_id!r}")
        if self.timestamp is not None:
            if isinstance(self.timestamp, bool) or not isinstance(self.timestamp, int | float):
                raise ValueError(f"timestamp must be a number of unix seconds, got {self.timestamp!r}")
            if not math.isfinite(self.timestamp):
                raise ValueError(f"timestamp must be finite, got {self.timestamp!r}")
            object.__setattr__(self, "timestamp", float(self.timestamp))


class HistoryStore(Protocol):
    name: str  # "redis" or "memory"

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        """Append ``events`` in order, keep the newest ``max_len``; returns the history's new length."""
        ...

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        """Several users' appends at once, all or nothing."""
        ...

    async def history(self, user_id: str) -> list[Event]:
        """Oldest first; ``[]`` for an unknown user."""
        ...

    async def delete(self, user_id: str) -> bool:
        """True if there was a history to delete."""
        ...

    async def ping(self) -> bool:
        """True when the store answers; never raises."""
        ...

    async def close(self) -> None: ...


def _check_user(user_id: str) -> None:
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"user_id must be a non-empty string, got {user_id!r}")


def _check_max_len(max_len: int) -> None:
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")


def _check_events(events: Sequence[Event]) -> None:
    for event in events:
        if not isinstance(event, Event):
            raise ValueError(f"events must be Event instances, got {type(event).__name__}")


class MemoryStore:
    """Histories in a dict of deques. Safe under asyncio: no method awaits while it touches the dict."""

    name = "memory"

    def __init__(self) -> None:
        self._histories: dict[str, deque[Event]] = {}

    def _append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        entries = self._histories.get(user_id)
        if entries is None:
            if not events:
                return 0
            entries = self._histories[user_id] = deque()
        entries.extend(events)
        while len(entries) > max_len:
            entries.popleft()
        return len(entries)

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        _check_user(user_id)
        _check_max_len(max_len)
        _check_events(events)
        return self._append(user_id, events, max_len)

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        _check_max_len(max_len)
        for user_id, events in batch:  # validate everything first: all or nothing
            _check_user(user_id)
            _check_events(events)
        for user_id, events in batch:
            self._append(user_id, events, max_len)

    async def history(self, user_id: str) -> list[Event]:
        _check_user(user_id)
        return list(self._histories.get(user_id, ()))

    async def delete(self, user_id: str) -> bool:
        _check_user(user_id)
        return self._histories.pop(user_id, None) is not None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def _encode(event: Event) -> str:
    entry: dict[str, Any] = {"i": event.item_id}
    if event.timestamp is not None:
        entry["t"] = event.timestamp
    return json.dumps(entry, separators=(",", ":"))


def _decode(raw: bytes | str) -> Event | None:
    try:
        entry = json.loads(raw)
        return Event(item_id=str(entry["i"]), timestamp=entry.get("t"))
    except (ValueError, TypeError, KeyError):
        return None


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class RedisStore:
    """Histories in Redis lists, through redis-py's asyncio client and a bounded connection pool."""

    name = "redis"

    def __init__(self, url: str, *, prefix: str = "seqrec:", timeout_ms: float = 250.0, pool_size: int = 64) -> None:
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.url = redact_url(url)
        self.prefix = prefix
        timeout_s = timeout_ms / 1000
        # One immediate retry on connection errors only: it replaces a pooled connection that died while idle
        # (Redis restarted) without the caller noticing. Timeouts are not retried, so a hung Redis costs one
        # timeout; a down one is refused at once. redis-py's default (3 retries with backoff) would be slower.
        # The blocking pool waits up to the timeout for a free connection instead of failing under bursts.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries=1, supported_errors=(rex.ConnectionError,)),
        )
        self._redis = aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes both

    def _key(self, user_id: str) -> str:
        return f"{self.prefix}history:{user_id}"

    @contextmanager
    def _unavailable_as_store_error(self) -> Iterator[None]:
        try:
            yield
        except _UNAVAILABLE as e:
            reason = str(e) or type(e).__name__
            raise StoreUnavailable(f"Redis at {self.url} is unreachable: {reason}") from e

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        _check_user(user_id)
        _check_max_len(max_len)
        _check_events(events)
        key = self._key(user_id)
        with self._unavailable_as_store_error():
            if not events:
                return int(await self._redis.llen(key))
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(key, *(_encode(e) for e in events))
                pipe.ltrim(key, -max_len, -1)
                pushed_len, _ = await pipe.execute()
        return min(int(pushed_len), max_len)

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        _check_max_len(max_len)
        for user_id, events in batch:  # validate everything before anything is sent: all or nothing
            _check_user(user_id)
            _check_events(events)
        if not any(events for _, events in batch):
            return
        with self._unavailable_as_store_error():
            async with self._redis.pipeline(transaction=True) as pipe:
                for user_id, events in batch:
                    if events:
                        key = self._key(user_id)
                        pipe.rpush(key, *(_encode(e) for e in events))
                        pipe.ltrim(key, -max_len, -1)
                await pipe.execute()

    async def history(self, user_id: str) -> list[Event]:
        _check_user(user_id)
        with self._unavailable_as_store_error():
            raw_entries = await self._redis.lrange(self._key(user_id), 0, -1)
        events = [_decode(raw) for raw in raw_entries]
        valid = [e for e in events if e is not None]
        if len(valid) != len(events):
            log.warning("skipped %d malformed history entries of user %r", len(events) - len(valid), user_id)
        return valid

    async def delete(self, user_id: str) -> bool:
        _check_user(user_id)
        with self._unavailable_as_store_error():
            return bool(await self._redis.delete(self._key(user_id)))

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (rex.RedisError, OSError):
            return False

    async def close(self) -> None:
        await self._redis.aclose()


def make_store(settings: Settings) -> HistoryStore:
    """``RedisStore`` when a Redis URL is configured, else the in-process ``MemoryStore``."""
    if settings.redis_url:
        return RedisStore(
            settings.redis_url,
            prefix=settings.redis_prefix,
            timeout_ms=settings.redis_timeout_ms,
            pool_size=settings.redis_pool_size,
        )
    return MemoryStore()
