"""History stores against real components: the Redis at 127.0.0.1:6379 (db 15, a unique key prefix per test,
keys deleted afterwards), a redis-server started and killed for the outage test (fixtures in conftest.py), and
the in-process store. The ordering, duplicate and seen-set contract is in test_store_contract.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable

import pytest
import redis.asyncio as aioredis

from common.redis_url import redact_url
from service.http.settings import Settings
from service.http.store import Event, HistoryStore, MemoryStore, RedisStore, StoreUnavailable, make_store
from tests.service.support import SHARED_REDIS, RedisServer, free_port

pytestmark = pytest.mark.anyio

def _ids(events: list[Event]) -> list[str]:
    return [e.item_id for e in events]


async def test_append_keeps_order_and_returns_length(store: HistoryStore) -> None:
    assert await store.append("u1", [Event("10"), Event("3")], max_len=10) == 2
    assert await store.append("u1", [Event("7")], max_len=10) == 3
    assert _ids(await store.history("u1")) == ["10", "3", "7"]
    assert await store.append("u1", [], max_len=10) == 3  # nothing to add: the current length
    assert await store.append("nobody", [], max_len=10) == 0


async def test_trim_keeps_the_newest(store: HistoryStore) -> None:
    assert await store.append("u1", [Event(str(i)) for i in range(5)], max_len=3) == 3
    assert _ids(await store.history("u1")) == ["2", "3", "4"]
    assert await store.append("u1", [Event("5")], max_len=3) == 3
    assert _ids(await store.history("u1")) == ["3", "4", "5"]
    # a smaller max_len trims what was there before
    assert await store.append("u1", [Event("6")], max_len=2) == 2
    assert _ids(await store.history("u1")) == ["5", "6"]


async def test_append_many(store: HistoryStore) -> None:
    await store.append("a", [Event("0")], max_len=3)
    batch = [
        ("a", [Event("1"), Event("2"), Event("3")]),
        ("b", [Event("x")]),
        ("c", []),
        ("b", [Event("y")]),
    ]
    await store.append_many(batch, max_len=3)
    assert _ids(await store.history("a")) == ["1", "2", "3"]
    assert _ids(await store.history("b")) == ["x", "y"]
    assert await store.history("c") == []


async def test_append_many_validates_before_writing(store: HistoryStore) -> None:
    with pytest.raises(ValueError, match="user_id"):
        await store.append_many([("a", [Event("1")]), ("", [Event("2")])], max_len=5)
    assert await store.history("a") == []


async def test_unknown_user_and_delete(store: HistoryStore) -> None:
    assert await store.history("ghost") == []
    assert await store.delete("ghost") is False
    await store.append("u1", [Event("1")], max_len=5)
    await store.append("u2", [Event("2")], max_len=5)
    assert await store.delete("u1") is True
    assert await store.history("u1") == []
    assert _ids(await store.history("u2")) == ["2"]  # other users untouched
    assert await store.delete("u1") is False


async def test_timestamps_round_trip(store: HistoryStore) -> None:
    events = [Event("d", 0.0), Event("c", 5), Event("a", 1_700_000_000.123456), Event("b")]
    await store.append("u1", events, max_len=10)
    got = await store.history("u1")
    assert got == [Event("d", 0.0), Event("c", 5.0), Event("a", 1_700_000_000.123456), Event("b", None)]
    assert isinstance(got[1].timestamp, float)


async def test_ping(store: HistoryStore) -> None:
    assert await store.ping() is True


async def test_input_validation(store: HistoryStore) -> None:
    with pytest.raises(ValueError, match="user_id"):
        await store.append("", [Event("1")], max_len=5)
    with pytest.raises(ValueError, match="max_len"):
        await store.append("u1", [Event("1")], max_len=0)
    with pytest.raises(ValueError, match="user_id"):
        await store.history("")
    with pytest.raises(ValueError, match="user_id"):
        await store.delete("")
    with pytest.raises(ValueError, match="item_id"):
        Event("")
    with pytest.raises(ValueError, match="item_id"):
        Event(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestamp"):
        Event("1", float("nan"))
    assert await store.history("u1") == []


async def test_concurrent_appends_are_atomic(store: HistoryStore, request: pytest.FixtureRequest) -> None:
    """50 concurrent appends of two items each, max_len 20: the list never exceeds 20 entries (checked by a
    concurrent reader on Redis), ends with exactly 20 distinct items, and every append's pair stays together."""
    max_len, n_appends = 20, 50
    done = asyncio.Event()
    lengths_seen: list[int] = []

    async def watch_length() -> None:
        if not isinstance(store, RedisStore):
            return
        async with aioredis.Redis.from_url(SHARED_REDIS) as raw:
            key = f"{store.prefix}{{u1}}:history"
            while not done.is_set():
                lengths_seen.append(int(await raw.llen(key)))

    async def appends() -> list[int]:
        try:
            return list(
                await asyncio.gather(
                    *(store.append("u1", [Event(f"{i}a"), Event(f"{i}b")], max_len) for i in range(n_appends))
                )
            )
        finally:
            done.set()

    returned, _ = await asyncio.gather(appends(), watch_length())
    assert max(returned) == max_len
    assert max(lengths_seen, default=0) <= max_len
    if isinstance(store, RedisStore):
        assert lengths_seen, "the reader never ran"

    items = _ids(await store.history("u1"))
    assert len(items) == max_len
    assert len(set(items)) == max_len
    # each append's two items are adjacent and in order: no other append interleaved with it
    for first, second in zip(items[::2], items[1::2], strict=True):
        assert first.endswith("a")
        assert second == first[:-1] + "b"


def test_make_store_picks_by_url() -> None:
    assert isinstance(make_store(Settings(redis_url=None)), MemoryStore)
    assert isinstance(make_store(Settings(redis_url="redis://127.0.0.1:1/0")), RedisStore)


def test_redact_url() -> None:
    assert redact_url("redis://:s3cret@host:6380/2") == "redis://:***@host:6380/2"
    assert redact_url("redis://me:s3cret@host/0") == "redis://me:***@host/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


# --- outages -------------------------------------------------------------------------------------------------


async def _fails_fast(call: Awaitable[object], limit_s: float = 1.0) -> StoreUnavailable:
    start = time.perf_counter()
    with pytest.raises(StoreUnavailable) as excinfo:
        await call
    assert time.perf_counter() - start < limit_s
    return excinfo.value


async def test_redis_killed_and_restarted(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    store = RedisStore(url, prefix="t:", timeout_ms=250)
    try:
        # a few calls at once so the pool holds several connections that the kill will leave dead
        await asyncio.gather(*(store.append(f"u{i}", [Event("1")], max_len=5) for i in range(4)))
        assert await store.append("u0", [Event("2")], max_len=5) == 2

        redis_server.kill()
        error = await _fails_fast(store.append("u0", [Event("3")], max_len=5))
        assert f"Redis at {url} is unreachable" in str(error)
        await _fails_fast(store.append_many([("u0", [Event("3")])], max_len=5))
        await _fails_fast(store.history("u0"))
        await _fails_fast(store.delete("u0"))
        start = time.perf_counter()
        assert await store.ping() is False
        assert time.perf_counter() - start < 1.0

        # same port, empty server (nothing on disk): the same store object recovers by itself
        redis_server.start()
        assert await store.ping() is True
        assert await store.append("u0", [Event("4")], max_len=5) == 1
        assert _ids(await store.history("u0")) == ["4"]

        # killed and restarted with no call in between: only stale pooled connections, still no error
        await asyncio.gather(*(store.history(f"u{i}") for i in range(4)))
        redis_server.kill()
        redis_server.start()
        assert await store.append("u0", [Event("5")], max_len=5) == 1
        assert await store.ping() is True
    finally:
        await store.close()


async def test_a_full_redis_refuses_writes_and_still_serves_reads(redis_server: RedisServer) -> None:
    """maxmemory reached under noeviction: appends fail as StoreUnavailable (the API's 503, retry later) saying
    that Redis refuses writes, not that it is unreachable; stored histories are still read."""
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    store = RedisStore(url, prefix="t:", timeout_ms=1000)
    try:
        assert await store.append("u0", [Event("1"), Event("2")], max_len=5) == 2
        async with aioredis.Redis.from_url(url) as admin:
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", "1")
        with pytest.raises(StoreUnavailable, match=f"Redis at {re.escape(url)} refuses writes: "):
            await store.append("u0", [Event("3")], max_len=5)
        with pytest.raises(StoreUnavailable, match="refuses writes"):
            await store.append_many([("u1", [Event("3")])], max_len=5)
        assert _ids(await store.history("u0")) == ["1", "2"]
        window = await store.read("u0")  # what user_id-only /recommend reads: no MULTI block past maxmemory
        assert (_ids(window.events), window.seen) == (["1", "2"], frozenset({"1", "2"}))
        assert await store.ping() is True
        assert await store.writable() is False
        async with aioredis.Redis.from_url(url) as admin:
            await admin.config_set("maxmemory", "0")
        assert await store.writable() is True
    finally:
        await store.close()


async def test_a_read_only_replica_serves_reads_and_says_it_takes_no_writes(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    store = RedisStore(url, prefix="t:", timeout_ms=1000)
    try:
        assert await store.append("u0", [Event("1"), Event("2")], max_len=5) == 2
        assert await store.writable() is True
        async with aioredis.Redis.from_url(url) as admin:
            await admin.replicaof("127.0.0.1", str(free_port()))  # a master that never answers: stale reads
        with pytest.raises(StoreUnavailable, match="refuses writes"):
            await store.append("u0", [Event("3")], max_len=5)
        window = await store.read("u0")
        assert (_ids(window.events), window.seen) == (["1", "2"], frozenset({"1", "2"}))
        assert await store.ping() is True
        assert await store.writable() is False
    finally:
        await store.close()


async def test_hung_redis_times_out_and_hides_password() -> None:
    """A server that accepts connections and never answers: calls fail after about the timeout, and the error
    names the store without its password."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes the handshakes; nobody ever reads
        port = listener.getsockname()[1]
        store = RedisStore(f"redis://:s3cret@127.0.0.1:{port}/0", timeout_ms=200)
        try:
            error = await _fails_fast(store.history("u1"), limit_s=0.6)
            assert f"Redis at redis://:***@127.0.0.1:{port}/0 did not answer in time" in str(error)
            assert "s3cret" not in str(error)
            await _fails_fast(store.append("u1", [Event("1")], max_len=5), limit_s=0.6)
            assert await store.ping() is False
        finally:
            with contextlib.suppress(Exception):
                await store.close()


async def test_a_hung_redis_times_out_saying_the_write_may_still_be_stored(redis_server: RedisServer) -> None:
    """A stopped (not dead) Redis: the append times out, and Redis runs it once it resumes. The 503 said
    "nothing was read or stored, retry", so a retry stored an event without a timestamp twice; it says now that
    the write may still be applied."""
    store = RedisStore(f"redis://127.0.0.1:{redis_server.port}/0", prefix="t:", timeout_ms=250)
    assert redis_server.proc is not None
    try:
        assert await store.append("u", [Event("1")], max_len=5) == 1
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match=r"did not answer in time \(a write may still be applied\)"):
                await store.append("u", [Event("2")], max_len=5)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while _ids(await store.history("u")) != ["1", "2"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _ids(await store.history("u")) == ["1", "2"]  # what the message warns of
    finally:
        await store.close()
