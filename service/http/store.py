"""Users' interaction histories behind ``POST /events``, ``/users/{id}/history`` and user_id-only ``/recommend``.

Per user, a store keeps two things:

- **the window**: the newest ``max_len`` events, what the model reads. Events carrying timestamps are kept in
  timestamp order: an out-of-order event is inserted in place (after the events with the same timestamp, so
  ties keep arrival order, as ``seqrec prepare``'s stable sort keeps file order), and an exact duplicate (same
  item, same timestamp) is dropped, as ``seqrec prepare`` drops it. An event without a timestamp goes at the
  end, and a later timestamped event is never placed before it (its time is unknown, its arrival is not).
- **the seen set**: every item the user was recorded with, for ``exclude_seen``, so items that left the window
  are still never recommended (offline evaluation excludes the whole history too). It holds at most
  ``seen_cap`` items (``SEQREC_SEEN_CAP``); past the cap, the items whose last event is the oldest to arrive
  are forgotten (any event of an item, a duplicate's too, makes it recent) and may be recommended again.
  Reads return the seen set together with the window's items, so a window item is always seen whatever the cap.

Two stores share one protocol and one behaviour (one contract test runs both):

- ``RedisStore``: per user, four keys in one hash slot (tagged ``{user_id}``, so a Redis Cluster keeps them on one
  node): a list ``{prefix}{user_id}:history`` (the window, each entry a compact JSON object ``{"i": item_id, "t":
  timestamp}``, ``"t"`` left out when there is none), a sorted set ``:seen`` (score = the order of recording), a
  sorted set ``:cut`` and a string ``:cut_at`` (the items last cut from the window at its newest cut timestamp, and
  that timestamp, so a replayed old event is still known as a duplicate). An append is one Lua script
  (`service.http.store_lua`): atomic, one round trip, its cost flat in the size of the seen set. Keys of the
  previous release (``{prefix}history:{user_id}``, ``seen:``, ``cut:``) are read as they are and converted on the
  user's first append; lists written before the seen set existed read as they are too (their items count as
  seen). ``GET /readyz`` sets ``{prefix}probe`` (10 s). A Redis Cluster and WAIT: `service.http.store_cluster`.
- ``MemoryStore``: the in-process default when no Redis URL is configured (one process, lost on restart).

Any failure to reach Redis (refused, reset, timeout, still loading its dataset, out of pooled connections), and
any error it answers (full, read-only, a database number it lacks, an ACL's NOPERM), becomes ``StoreUnavailable``,
which the API answers with 503 so clients retry; an event is never dropped silently. The client keeps no long
retry loop: a down Redis fails within about ``redis_timeout_ms``; the pool reconnects by itself once Redis is back.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import redis.exceptions as rex

from common.errors import SeqrecError, first_line
from common.redis_url import cluster_node_url, redact_url
from service.http import store_cluster as rc
from service.http.redis_errors import PROBE_MS, STORE_ERRORS, StoreUnavailable, foreign_user, probe, redis_state
from service.http.settings import DEFAULT_SEEN_CAP, Settings
from service.http.store_checks import check_max_len, check_seen_cap, check_user
from service.http.store_lua import APPEND, user_keys
from service.http.store_memory import Record

log = logging.getLogger(__name__)


class ForeignHistory(SeqrecError):
    """A user's keys hold values seqrec did not write (Redis WRONGTYPE); the API maps it to 409."""


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


@dataclass(frozen=True)
class UserHistory:
    events: list[Event]  # the window, oldest first
    seen: frozenset[str]  # every remembered item, the window's included


class HistoryStore(Protocol):
    name: str  # "redis", "redis-cluster" or "memory"
    seen_cap: int

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        """Record ``events`` in order (in place by timestamp, exact duplicates dropped), keep the newest
        ``max_len`` in the window; returns the window's new length."""
        ...

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        """Several users' appends at once, all or nothing."""
        ...

    async def history(self, user_id: str) -> list[Event]:
        """The window, oldest first; ``[]`` for an unknown user."""
        ...

    async def read(self, user_id: str) -> UserHistory:
        """The window and the seen set, read together."""
        ...

    async def delete(self, user_id: str) -> bool:
        """True if there was a history to delete."""
        ...

    async def ping(self) -> bool:
        """True when the store answers; never raises."""
        ...

    async def writable(self) -> bool:
        """True when the store takes writes; never raises. A Redis that is full under ``noeviction`` or a
        read-only replica answers PING and serves reads, but refuses every event."""
        ...

    async def close(self) -> None: ...


def _check_events(events: Sequence[Event]) -> None:
    for event in events:
        if not isinstance(event, Event):
            raise ValueError(f"events must be Event instances, got {type(event).__name__}")


class MemoryStore:
    """Histories in a dict. Safe under asyncio: no method awaits while it touches the dict."""

    name = "memory"

    def __init__(self, *, seen_cap: int = DEFAULT_SEEN_CAP) -> None:
        self.seen_cap = check_seen_cap(seen_cap)
        self._records: dict[str, Record] = {}

    def _append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        record = self._records.get(user_id)
        if not events:  # nothing recorded, nothing cut: as Redis, which is not even called
            return 0 if record is None else len(record.window)
        if record is None:
            record = self._records[user_id] = Record()
        for event in events:
            if not record.is_duplicate(event):
                record.insert(event)
            record.record_seen(event.item_id)
        record.trim(max_len, self.seen_cap)
        return len(record.window)

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        check_user(user_id)
        check_max_len(max_len)
        _check_events(events)
        return self._append(user_id, events, max_len)

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        check_max_len(max_len)
        for user_id, events in batch:  # validate everything first: all or nothing
            check_user(user_id)
            _check_events(events)
        for user_id, events in batch:
            self._append(user_id, events, max_len)

    async def history(self, user_id: str) -> list[Event]:
        return (await self.read(user_id)).events

    async def read(self, user_id: str) -> UserHistory:
        check_user(user_id)
        record = self._records.get(user_id) or Record()
        return UserHistory(list(record.window), frozenset(record.seen).union(e.item_id for e in record.window))

    async def delete(self, user_id: str) -> bool:
        check_user(user_id)
        return self._records.pop(user_id, None) is not None

    async def ping(self) -> bool:
        return True

    async def writable(self) -> bool:
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


def _decode_window(raw_entries: list[bytes | str], user_id: str) -> list[Event]:
    events = [_decode(raw) for raw in raw_entries]
    valid = [e for e in events if e is not None]
    if len(valid) != len(events):
        log.warning("skipped %d malformed history entries of user %r", len(events) - len(valid), user_id)
    return valid


class RedisStore:
    """Histories in Redis lists and sorted sets, through redis-py's asyncio client (a Redis Cluster's for a
    ``redis+cluster://`` URL) and bounded connection pools."""

    def __init__(self, url: str, *, prefix: str = "seqrec:", timeout_ms: float = 250.0, pool_size: int = 64,
                 seen_cap: int = DEFAULT_SEEN_CAP, legacy_keys: bool = True, wait_replicas: int = 0,
                 wait_ms: int = 100) -> None:
        self.seen_cap, self.cluster = check_seen_cap(seen_cap), cluster_node_url(url) is not None
        self.name = "redis-cluster" if self.cluster else "redis"
        # read and convert the previous release's keys: outside the user's slot, so never on a cluster
        self.legacy_keys = legacy_keys and not self.cluster
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        if wait_replicas < 0 or wait_ms < 1:
            raise ValueError(f"wait_replicas must be >= 0 and wait_ms >= 1, got {wait_replicas} and {wait_ms}")
        self.url, self.prefix = redact_url(url), prefix
        self.wait_replicas, self.wait_ms = wait_replicas, wait_ms
        # an append that waits for replicas may take wait_ms more than the command timeout before its answer
        timeout_s = (timeout_ms + (wait_ms if wait_replicas else 0)) / 1000
        self._deadline_s = 4 * timeout_s if self.cluster else None  # its client retries through a failover
        self._redis = rc.redis_client(url, pool_size=pool_size, timeout_s=timeout_s)
        self._slot_map = rc.SlotMap(self._redis) if isinstance(self._redis, rc.RedisCluster) else None
        self._append_script = self._redis.register_script(APPEND)

    def _keys(self, user_id: str) -> list[str]:
        """The keys `service.http.store_lua.APPEND` takes, in its order: the window, the seen set, the cut ties and
        their timestamp, all tagged ``{user_id}`` (one hash slot); then, with ``legacy_keys``, the previous
        release's window, seen set and cut ties, which the script converts on the user's first append."""
        keys = user_keys(self.prefix, user_id)
        if self.legacy_keys:
            keys += [f"{self.prefix}{kind}:{user_id}" for kind in ("history", "seen", "cut")]
        return keys

    def _script_args(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> list[str | int]:
        args: list[str | int] = [max_len, self.seen_cap, 7 if self.legacy_keys else 4]
        for _, events in batch:
            args.append(len(events))
            for e in events:
                args += [_encode(e), e.item_id, "" if e.timestamp is None else repr(e.timestamp)]
        return args

    @contextmanager
    def _unavailable_as_store_error(self, users: Sequence[str] = ()) -> Iterator[None]:
        try:
            yield
        except STORE_ERRORS as e:
            if "WRONGTYPE" in str(e):  # another program's value under the prefix: retrying cannot help
                raise ForeignHistory(f"the stored history of {foreign_user(e, users)} (keys {self.prefix}*) holds "
                                     f"values seqrec did not write ({first_line(e)}); "
                                     "DELETE /users/{user_id}/history clears it") from e
            state = redis_state(e)
            answered = state in ("refused the request", "refuses writes")  # Redis's own words name no address
            raise StoreUnavailable(f"Redis at {self.url} {state}: {str(e) or type(e).__name__}",
                                   f"Redis {state}" + (f": {first_line(e)}" if answered else "")) from e
        except (AttributeError, RuntimeError) as e:
            if not (self.cluster and rc.dropped_mid_command(e)):
                raise
            raise StoreUnavailable(f"Redis at {self.url} is unreachable: a connection closed while the cluster "
                                   "changed", "Redis is unreachable") from e

    async def _append_batch(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> list[int]:
        """One script call for every user's events, their key types checked before anything is written; on a
        cluster, one call per hash slot (a script's keys must share one), sent together."""
        if not self.cluster:
            return await self._append_group(batch, max_len)
        with self._unavailable_as_store_error([user_id for user_id, _ in batch]):
            return await rc.within(rc.by_slot([self._keys(user_id)[0] for user_id, _ in batch],
                                        lambda group: self._append_group([batch[k] for k in group], max_len)),
                                self._deadline_s)

    async def _append_group(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> list[int]:
        keys = [key for user_id, _ in batch for key in self._keys(user_id)]
        args = self._script_args(batch, max_len)
        with self._unavailable_as_store_error([user_id for user_id, _ in batch]):
            lengths, confirmed = await rc.through_failover(self._slot_map, lambda: self._run_script(keys, args))
        if confirmed < self.wait_replicas:
            waited = (f"applied the events, but {confirmed} of the {self.wait_replicas} replicas required confirmed "
                      f"them within {self.wait_ms} ms (SEQREC_REDIS_WAIT_REPLICAS): they may not survive the "
                      "master's loss")
            raise StoreUnavailable(f"Redis at {self.url} {waited}", f"Redis {waited}")
        return lengths

    async def _run_script(self, keys: list[str], args: list[str | int]) -> tuple[list[int], int]:
        """The append script's window lengths, and how many replicas confirmed it (0 without WAIT)."""
        client = await rc.connected(self._redis)
        if not self.wait_replicas:
            return [int(n) for n in await self._append_script(keys, args, client)], 0
        lengths, confirmed = await rc.append_waiting(client, self._append_script, keys, args, self.wait_replicas,
                                                     self.wait_ms)
        return [int(n) for n in lengths], confirmed

    async def append(self, user_id: str, events: Sequence[Event], max_len: int) -> int:
        check_user(user_id)
        check_max_len(max_len)
        _check_events(events)
        if not events:
            return len((await self._read(user_id, seen=False))[0])
        return (await self._append_batch([(user_id, events)], max_len))[0]

    async def append_many(self, batch: Sequence[tuple[str, Sequence[Event]]], max_len: int) -> None:
        check_max_len(max_len)
        for user_id, events in batch:  # validate everything before anything is sent: all or nothing
            check_user(user_id)
            _check_events(events)
        if any(events for _, events in batch):
            await self._append_batch([(user_id, events) for user_id, events in batch if events], max_len)

    async def history(self, user_id: str) -> list[Event]:
        check_user(user_id)
        return _decode_window((await self._read(user_id, seen=False))[0], user_id)

    async def read(self, user_id: str) -> UserHistory:
        check_user(user_id)
        raw_entries, seen = await self._read(user_id, seen=True)
        events = _decode_window(raw_entries, user_id)
        return UserHistory(events, frozenset(i.decode() for i in seen).union(e.item_id for e in events))

    async def _read(self, user_id: str, *, seen: bool) -> tuple[list[Any], list[Any]]:
        """(window entries, seen items) of the tagged keys, read together; the previous release's keys' while
        the user has no tagged ones (not converted yet: that is the first append's work)."""
        keys = self._keys(user_id)
        pairs = [(keys[0], keys[1]), *([(keys[4], keys[5])] if self.legacy_keys else [])]
        with self._unavailable_as_store_error([user_id]):
            try:
                found = await rc.within(rc.through_failover(
                    self._slot_map, lambda: self._read_keys(pairs, seen=seen, transaction=True)), self._deadline_s)
            except rex.OutOfMemoryError:
                # Past maxmemory Redis queues no MULTI block, reads included; it then takes no write but a deletion
                # (whose window items stay seen by the union in `read`), so the reads without MULTI see one history.
                found = await self._read_keys(pairs, seen=seen, transaction=False)
        return next((pair for pair in found if pair[0] or pair[1]), found[0])

    async def _read_keys(self, pairs: list[tuple[str, str]], *, seen: bool,
                         transaction: bool) -> list[tuple[list[Any], list[Any]]]:
        async with (await rc.connected(self._redis)).pipeline(transaction=transaction) as pipe:
            for window_key, seen_key in pairs:
                pipe.lrange(window_key, 0, -1)
                if seen:
                    pipe.zrange(seen_key, 0, -1)
            replies = list(await pipe.execute())
        step = 2 if seen else 1
        return [(replies[k], replies[k + 1] if seen else []) for k in range(0, len(replies), step)]

    async def delete(self, user_id: str) -> bool:
        check_user(user_id)
        with self._unavailable_as_store_error():
            return bool(await rc.within(rc.through_failover(self._slot_map, lambda: self._delete(user_id)),
                                        self._deadline_s))

    async def _delete(self, user_id: str) -> int:
        return int(await (await rc.connected(self._redis)).delete(*self._keys(user_id)))

    async def ping(self) -> bool:
        try:
            return await rc.within(rc.ping(await rc.connected(self._redis)), self._deadline_s)
        except (rex.RedisError, rex.RedisClusterException, OSError):
            return False

    async def writable(self) -> bool:
        """A real write (a probe key under the prefix that expires in 10 s): Redis refuses it exactly when it
        would refuse an event (maxmemory reached under noeviction, READONLY replica, a lost connection)."""
        try:
            client = await rc.connected(self._redis)
            return bool(await rc.within(client.set(*probe(self.prefix), px=PROBE_MS), self._deadline_s))
        except (rex.RedisError, rex.RedisClusterException, OSError):
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
            seen_cap=settings.seen_cap,
            wait_replicas=settings.redis_wait_replicas,
            wait_ms=settings.redis_wait_ms,
        )
    return MemoryStore(seen_cap=settings.seen_cap)
