"""Histories on a real Redis Cluster (three masters the session starts, `tests/service/conftest.py:redis_cluster`)
and appends that wait for a replica (WAIT): where each user's keys live, what cluster mode does not read, the
service over HTTP against the cluster and against one Redis giving the same answers, and the WAIT setting's two
outcomes (a replica confirmed: the replica holds the events as soon as the append returns; none could: a 503);
and a master killed (a cluster with replicas of its own): quick 503s while it is down, no 503 once its replica has
taken over."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from redis.crc import key_slot

from offline.bench.faults.cluster_failover import whole
from offline.bench.lib.redis_cluster import RedisClusterProcesses, ReplicatedRedis
from service.http import store_cluster as rc
from service.http.store import Event, RedisStore, StoreUnavailable
from tests import needs
from tests.service.support import SHARED_REDIS, serving


def _owner(cluster: RedisClusterProcesses, key: str) -> int:
    """The port of the master whose node holds ``key`` (asked of every master: exactly one has it)."""
    holders = []
    for node in cluster.masters():
        with node.client() as client:
            if client.execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(key.encode())) and client.exists(key):
                holders.append(node.port)
    assert len(holders) == 1, (key, holders)
    return holders[0]


@pytest.mark.anyio
async def test_each_user_s_keys_live_on_one_master_and_users_spread_over_all(redis_cluster: RedisClusterProcesses,
                                                                             cluster_prefix: str) -> None:
    store = RedisStore(redis_cluster.url, prefix=cluster_prefix, timeout_ms=5000, seen_cap=3)
    try:
        assert store.name == "redis-cluster"
        assert store.legacy_keys is False
        users = [f"u{k}" for k in range(24)]
        # one batch across many slots: one script call per slot, every user's events stored
        await store.append_many([(user, [Event(i, 1.0) for i in "abcdef"]) for user in users], max_len=2)
        owners = set()
        for user in users:
            assert (await store.read(user)).seen == set("def")
            keys = store._keys(user)
            assert len(keys) == 4
            assert len({key_slot(k.encode()) for k in keys}) == 1
            owners.add(_owner(redis_cluster, keys[0]))
            assert {_owner(redis_cluster, k) for k in keys} == {_owner(redis_cluster, keys[0])}
        assert owners == {node.port for node in redis_cluster.masters()}
        assert await store.append("u0", [Event("c", 1.0)], max_len=2) == 2  # cut at 1.0: a duplicate, dropped
        assert await store.delete("u0") is True
        assert (await store.read("u0")).events == []
        assert await store.ping()
        assert await store.writable()
    finally:
        await store.close()


@pytest.mark.anyio
async def test_the_previous_release_s_keys_are_not_read_on_a_cluster(redis_cluster: RedisClusterProcesses,
                                                                    cluster_prefix: str) -> None:
    """`{prefix}history:{user}` lies in another slot than the user's tagged keys: a script could not touch both."""
    with redis.RedisCluster.from_url(redis_cluster.url.replace("redis+cluster", "redis")) as raw:
        raw.rpush(f"{cluster_prefix}history:old", '{"i":"a"}')
    store = RedisStore(redis_cluster.url, prefix=cluster_prefix, timeout_ms=5000)
    try:
        assert (await store.read("old")).events == []
        assert await store.append("old", [Event("b")], max_len=5) == 1
        assert [e.item_id for e in await store.history("old")] == ["b"]
    finally:
        await store.close()


@pytest.mark.anyio
async def test_wait_for_a_replica(redis_cluster: RedisClusterProcesses, cluster_prefix: str, tmp_path: Path) -> None:
    needs.program("redis-server")
    with ReplicatedRedis(tmp_path / "pair") as pair:
        store = RedisStore(pair.master.url, timeout_ms=2000, wait_replicas=1, wait_ms=1000)
        try:
            for k in range(20):
                assert await store.append(f"u{k}", [Event("i1", float(k)), Event("i2")], max_len=5) == 2
                with pair.replica.client() as replica:  # WAIT returned: the replica has it already
                    assert replica.llen(store._keys(f"u{k}")[0]) == 2
        finally:
            await store.close()
    # the session's cluster has no replicas: nobody can confirm, so the append is a 503 that says so
    lonely = RedisStore(redis_cluster.url, prefix=cluster_prefix, timeout_ms=2000, wait_replicas=1, wait_ms=20)
    try:
        with pytest.raises(StoreUnavailable, match=r"applied the events, but 0 of the 1 replicas required confirmed"):
            await lonely.append("w", [Event("i1")], max_len=5)
    finally:
        await lonely.close()


def _lists(client: httpx.Client, users: list[str]) -> list[list[str]]:
    answers = []
    for user in users:
        response = client.post("/recommend", json={"user_id": user, "k": 10})
        assert response.status_code == 200, response.text
        assert response.json()["fallback"] is None
        answers.append([i["item_id"] for i in response.json()["items"]])
    return answers


def test_the_service_over_a_cluster_answers_as_over_one_redis(bundle: Path, redis_cluster: RedisClusterProcesses,
                                                             cluster_prefix: str, redis_prefix: str,
                                                             tmp_path: Path) -> None:
    """A real uvicorn server on the cluster and one on the shared Redis, the same events posted to both (single and
    batched, several users per batch, so several slots per call): the same stored histories, the same lists."""
    users = [f"user-{uuid.uuid4().hex[:6]}-{k}" for k in range(12)]
    batches = [{"events": [{"user_id": users[(b + k) % len(users)], "item_id": f"i{(7 * b + 3 * k) % 60 + 1}",
                            "timestamp": 100 + b} for k in range(5)]} for b in range(12)]
    answers = []
    for name, url, prefix in (("single", SHARED_REDIS, redis_prefix),
                              ("cluster", redis_cluster.url, cluster_prefix)):
        with serving(tmp_path / name, artifacts=str(bundle), redis_url=url, redis_prefix=prefix,
                     redis_timeout_ms="2000") as api, api.client() as client:
            store = client.get("/readyz").json()["store"]
            assert store == {"kind": "redis-cluster" if name == "cluster" else "redis", "reachable": True,
                             "writable": True}
            for batch in batches:
                assert client.post("/events", json=batch).status_code == 200
            assert client.post("/events", json={"user_id": users[0], "item_id": "i5"}).status_code == 200
            histories = [client.get(f"/users/{user}/history").json()["items"] for user in users]
            answers.append((histories, _lists(client, users)))
    assert answers[0] == answers[1]
    assert all(answers[1][0])
    assert all(answers[1][1])


@pytest.mark.anyio
async def test_a_killed_master_fails_calls_quickly_then_none_once_its_replica_took_over(tmp_path: Path) -> None:
    """SIGKILL of a master under a warm client (slot map read, script loaded on every master). While it is down, a
    call on its slots is a 503 within the store's deadline (4 x the timeout), not a hang; once the cluster is whole
    again, every call succeeds at its first try, a burst of them at once included: the client's slot map, read
    while the dead master still owned its slots, is re-read on the first failure and the call sent again."""
    needs.program("redis-server")
    needs.program("redis-cli")
    timeout_ms = 300
    with RedisClusterProcesses(tmp_path / "cluster", masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        store = RedisStore(cluster.url, timeout_ms=timeout_ms)
        try:
            users = [f"u{k}" for k in range(30)]
            await store.append_many([(user, [Event("before", 1.0)]) for user in users], max_len=5)
            victim = next(node for node in cluster.masters() if node is not cluster.nodes[0])
            on_victim = [user for user in users if _owner(cluster, store._keys(user)[0]) == victim.port]
            assert on_victim
            victim.kill()
            for call in (lambda: store.append(on_victim[0], [Event("during", 2.0)], max_len=5),
                         lambda: store.read(on_victim[0])):
                started = time.perf_counter()
                with pytest.raises(StoreUnavailable):
                    await call()
                assert time.perf_counter() - started < 4 * timeout_ms / 1000
            deadline = time.monotonic() + 30
            while not whole(cluster):
                assert time.monotonic() < deadline, "the replica did not take over within 30 s"
                await asyncio.sleep(0.05)
            reads = await asyncio.gather(*(store.read(user) for user in users))  # one burst, many on the old map
            assert all(read.events[0].item_id == "before" for read in reads)
            for user in users:
                assert await store.append(user, [Event("after", 3.0)], max_len=5) == 2
                assert [e.item_id for e in await store.history(user)] == ["before", "after"]
            assert await store.delete(on_victim[0]) is True
            assert await store.ping()
        finally:
            await store.close()


class _FakeNodes:
    def __init__(self) -> None:
        self.reads = 0

    async def initialize(self) -> None:
        self.reads += 1


@pytest.mark.anyio
async def test_through_failover_retries_a_lost_node_once_and_never_a_timeout() -> None:
    """A lost connection: one map read, one more try. A timeout: a map read, raised, not resent (it may run)."""
    nodes = _FakeNodes()
    slot_map = rc.SlotMap(type("Client", (), {"nodes_manager": nodes})())  # type: ignore[arg-type]
    sent: list[str] = []

    async def refused_once() -> str:
        sent.append("x")
        if len(sent) == 1:
            raise redis.ConnectionError("refused")
        return "ok"

    assert await rc.through_failover(slot_map, refused_once) == "ok"
    assert (len(sent), nodes.reads) == (2, 1)

    async def times_out() -> str:
        sent.append("t")
        raise redis.TimeoutError("no answer")

    with pytest.raises(redis.TimeoutError):
        await rc.through_failover(slot_map, times_out)
    assert (sent.count("t"), nodes.reads) == (1, 2)
