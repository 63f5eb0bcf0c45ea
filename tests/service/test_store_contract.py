"""What a history store keeps, one contract for every store (the in-process one, the real Redis at 127.0.0.1:6379,
db 15, a unique key prefix, and a real Redis Cluster of three masters the tests start): the window in timestamp
order, exact duplicates dropped, the seen set past the window and its cap, checked against hand-written answers
and against a plain reference (a stable sort by timestamp after dropping repeats of (item, timestamp), as
``seqrec prepare`` does); then the stores against each other on random events, Redis lists written before the
seen set existed, and keys the previous release wrote (its own script, kept as a fixture) converted on the first
append."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from service.http.settings import DEFAULT_SEEN_CAP
from service.http.store import Event, HistoryStore, MemoryStore, RedisStore
from tests.service.conftest import StoreFactory
from tests.service.support import SHARED_REDIS

pytestmark = pytest.mark.anyio


def _window(events: list[Event]) -> list[tuple[str, float | None]]:
    return [(e.item_id, e.timestamp) for e in events]


async def test_out_of_order_events_are_inserted_in_place(store: HistoryStore) -> None:
    await store.append("u", [Event("a", 10), Event("b", 30)], max_len=10)
    await store.append("u", [Event("c", 20), Event("d", 5), Event("e", 30), Event("f", 40)], max_len=10)
    # e ties with b and arrived later, so it goes after b (stable, as prepare's sort keeps file order)
    assert _window(await store.history("u")) == [("d", 5), ("a", 10), ("c", 20), ("b", 30), ("e", 30), ("f", 40)]


async def test_events_without_timestamp_go_last_and_hold_their_place(store: HistoryStore) -> None:
    await store.append("u", [Event("a", 10), Event("n"), Event("b", 20)], max_len=10)
    await store.append("u", [Event("c", 5), Event("m")], max_len=10)
    # c is older than everything, but "n" has no time: c is never moved before an event whose time is unknown
    assert _window(await store.history("u")) == [("a", 10), ("n", None), ("c", 5), ("b", 20), ("m", None)]
    await store.append("u", [Event("n"), Event("m")], max_len=10)  # no timestamp, no duplicate: a re-read
    assert len(await store.history("u")) == 7


async def test_exact_duplicates_are_dropped(store: HistoryStore) -> None:
    assert await store.append("u", [Event("a", 10), Event("b", 20), Event("a", 10)], max_len=10) == 2
    assert await store.append("u", [Event("b", 20), Event("a", 11), Event("b", 10)], max_len=10) == 4
    assert _window(await store.history("u")) == [("a", 10), ("b", 10), ("a", 11), ("b", 20)]


async def test_a_replayed_event_already_cut_from_the_window_is_still_a_duplicate(store: HistoryStore) -> None:
    """a@5 and x@5 tie; a arrived first and was cut. Replayed (a client retrying), a@5 must not push x out."""
    await store.append("u", [Event("a", 5), Event("x", 5), Event("y", 6)], max_len=2)
    assert _window(await store.history("u")) == [("x", 5), ("y", 6)]
    assert await store.append("u", [Event("a", 5)], max_len=2) == 2
    assert _window(await store.history("u")) == [("x", 5), ("y", 6)]
    # a new item at the tied time arrived after x: it belongs after x, so x is the one cut
    await store.append("u", [Event("b", 5)], max_len=2)
    assert _window(await store.history("u")) == [("b", 5), ("y", 6)]


async def test_seen_set_reaches_past_the_window(store: HistoryStore) -> None:
    await store.append("u", [Event(str(i), float(i)) for i in range(50)], max_len=5)
    await store.append("u", [Event("old", -1.0)], max_len=5)  # older than the window: cut at once, still seen
    stored = await store.read("u")
    assert _window(stored.events) == [(str(i), float(i)) for i in range(45, 50)]
    assert stored.seen == {*(str(i) for i in range(50)), "old"}
    assert stored.events == await store.history("u")
    assert (await store.read("nobody")).seen == frozenset()
    assert await store.delete("u") is True
    assert await store.read("u") == await store.read("nobody")


async def test_past_the_cap_the_least_recently_recorded_items_are_forgotten(store_factory: StoreFactory) -> None:
    store = store_factory(seen_cap=4)
    assert store.seen_cap == 4
    await store.append("u", [Event(i) for i in "abcdef"], max_len=2)
    assert (await store.read("u")).seen == set("cdef")
    await store.append("u", [Event("c")], max_len=2)  # recorded again: c becomes the most recent
    await store.append("u", [Event("g")], max_len=2)
    assert (await store.read("u")).seen == set("efcg")
    # the window's items are always seen, even with a cap below max_len
    await store.append("v", [Event(i) for i in "abcdef"], max_len=6)
    assert (await store.read("v")).seen == set("abcdef")


def _reference(events: list[Event], max_len: int, seen_cap: int) -> tuple[list[Event], set[str]]:
    """What ``seqrec prepare`` would make of these events (drop repeats of (item, timestamp), stable sort by
    timestamp), cut to the newest ``max_len``; the seen items, those whose last event came first forgotten past
    the cap."""
    kept = list(dict.fromkeys(events))  # the first of each (item, timestamp)
    window = sorted(kept, key=lambda e: e.timestamp or 0.0)[-max_len:]
    seen = list(dict.fromkeys(e.item_id for e in reversed(events)))[:seen_cap]  # any event makes its item recent
    return window, set(seen) | {e.item_id for e in window}


@pytest.mark.parametrize("seen_cap", [DEFAULT_SEEN_CAP, 6])
async def test_random_timestamped_events_match_the_reference(store_factory: StoreFactory, seen_cap: int) -> None:
    """Few items and few timestamps, so ties, out-of-order events and replays of cut events are frequent."""
    rng = random.Random(7)
    store = store_factory(seen_cap=seen_cap)
    for user in range(20):
        sent: list[Event] = []
        max_len = rng.randint(1, 8)
        for _ in range(rng.randint(1, 12)):
            batch = [Event(f"i{rng.randint(0, 9)}", float(rng.randint(0, 6))) for _ in range(rng.randint(1, 4))]
            sent += batch
            returned = await store.append(f"u{user}", batch, max_len=max_len)
            window, seen = _reference(sent, max_len, seen_cap)
            stored = await store.read(f"u{user}")
            assert stored.events == window, (user, sent)
            assert returned == len(window)
            assert stored.seen == seen, (user, sent)


async def test_redis_and_memory_agree_on_random_events(redis_target: tuple[str, str]) -> None:
    """Timestamps or none, batches of several users, a small cap and a max_len that changes (a bundle reload); on
    one Redis and on a cluster (where a batch's users lie in several slots: one script call per slot)."""
    rng = random.Random(11)
    memory = MemoryStore(seen_cap=5)
    url, prefix = redis_target
    redis_store = RedisStore(url, prefix=prefix, timeout_ms=5000, seen_cap=5)
    try:
        for _ in range(150):
            batch = [(f"u{rng.randint(0, 3)}",
                      [Event(f"i{rng.randint(0, 8)}", rng.choice([None, *map(float, range(5))]))
                       for _ in range(rng.randint(0, 4))])
                     for _ in range(rng.randint(1, 3))]
            max_len = rng.choice([3, 4, 6])
            if len(batch) == 1:
                user, events = batch[0]
                assert await memory.append(user, events, max_len) == await redis_store.append(user, events, max_len)
            else:
                await memory.append_many(batch, max_len)
                await redis_store.append_many(batch, max_len)
            for user in (f"u{u}" for u in range(4)):
                assert await memory.read(user) == await redis_store.read(user), batch
    finally:
        await redis_store.close()


async def test_redis_lists_from_before_the_seen_set_still_read(redis_prefix: str) -> None:
    """A list written by the previous release (RPUSH + LTRIM, arrival order, no seen set): read as it is, its
    items count as seen, and the next append adds to it in place. No migration step."""
    async with aioredis.Redis.from_url(SHARED_REDIS) as raw:
        await raw.rpush(f"{redis_prefix}history:old", *(json.dumps(e) for e in
                                                         [{"i": "a", "t": 30.0}, {"i": "b", "t": 10.0}, {"i": "c"}]))
    store = RedisStore(SHARED_REDIS, prefix=redis_prefix, timeout_ms=5000)
    try:
        stored = await store.read("old")
        assert _window(stored.events) == [("a", 30.0), ("b", 10.0), ("c", None)]
        assert stored.seen == {"a", "b", "c"}
        await store.append("old", [Event("d", 20.0), Event("a", 30.0)], max_len=3)
        stored = await store.read("old")
        assert _window(stored.events) == [("b", 10.0), ("c", None), ("d", 20.0)]
        assert stored.seen == {"a", "b", "c", "d"}
    finally:
        await store.close()


OLD_APPEND = (Path(__file__).parent / "fixtures" / "append_v1.lua").read_text()


async def _old_append(raw: aioredis.Redis, prefix: str, batch: list[tuple[str, list[Event]]], max_len: int,
                      seen_cap: int) -> None:
    """Appends as the previous release made them (its script, its key names)."""
    keys = [f"{prefix}{kind}:{user}" for user, _ in batch for kind in ("history", "seen", "cut")]
    args: list[str | int] = [max_len, seen_cap]
    for _, events in batch:
        args.append(len(events))
        for e in events:
            args += [json.dumps({"i": e.item_id, **({} if e.timestamp is None else {"t": e.timestamp})}), e.item_id,
                     "" if e.timestamp is None else repr(e.timestamp)]
    await raw.eval(OLD_APPEND, len(keys), *keys, *args)


async def test_the_previous_release_s_keys_read_as_they_are_and_convert_on_the_first_append(redis_prefix: str) -> None:
    """Histories the previous release wrote (its own append script: untagged keys, the cut ties a list) read the same
    before any append, and after the first append they live in the tagged keys only, the old ones gone; then each
    user goes on exactly as an in-process store given every event from the start (ties at one timestamp, so the cut
    ties are many and replays of cut events frequent)."""
    rng = random.Random(5)
    memory = MemoryStore(seen_cap=6)
    store = RedisStore(SHARED_REDIS, prefix=redis_prefix, timeout_ms=5000, seen_cap=6)
    users = [f"u{u}" for u in range(6)]
    try:
        async with aioredis.Redis.from_url(SHARED_REDIS) as raw:
            for step in range(60):
                user = rng.choice(users)
                events = [Event(f"i{rng.randint(0, 9)}", rng.choice([None, 1.0, 1.0, 2.0]))
                          for _ in range(rng.randint(1, 4))]
                await memory.append(user, events, max_len=3)
                if step < 40:
                    await _old_append(raw, redis_prefix, [(user, events)], max_len=3, seen_cap=6)
                else:
                    await store.append(user, events, max_len=3)
                for who in users:
                    assert await store.read(who) == await memory.read(who), (step, who)
                    assert await store.history(who) == await memory.history(who)
            old = [key async for key in raw.scan_iter(match=f"{redis_prefix}history:*")]
            converted = {user for user in users if await raw.exists(f"{redis_prefix}{{{user}}}:history")}
            assert converted
            assert all(f"{redis_prefix}history:{user}".encode() not in old for user in converted)
            assert await raw.exists(*(f"{redis_prefix}{kind}:{user}" for kind in ("seen", "cut")
                                      for user in converted)) == 0
            assert await store.delete(users[0]) is True
            assert await raw.exists(*store._keys(users[0])) == 0
    finally:
        await store.close()


async def test_without_the_previous_release_s_names_each_user_s_keys_share_one_hash_slot(redis_prefix: str) -> None:
    store = RedisStore(SHARED_REDIS, prefix=redis_prefix, timeout_ms=5000, seen_cap=3, legacy_keys=False)
    try:
        for user in ("u1", "a}b", "{x}"):
            await store.append(user, [Event(i, 1.0) for i in "abcdef"], max_len=2)  # window, seen, cut, cut_at
            assert (await store.read(user)).seen == set("def")
            async with aioredis.Redis.from_url(SHARED_REDIS) as raw:
                written = [key for key in store._keys(user) if await raw.exists(key)]
            assert len(written) == 4
            assert len({key_slot(key.encode()) for key in written}) == 1
            assert await store.append(user, [Event("c", 1.0)], max_len=2) == 2  # cut at 1.0: a duplicate
            assert _window(await store.history(user)) == [("e", 1.0), ("f", 1.0)]
    finally:
        await store.close()
