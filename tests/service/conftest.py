"""Fixtures of the service tests: the tiny bundle (trained once per session), the Redis at 127.0.0.1:6379
(db 15, a unique key prefix, keys deleted afterwards), a throwaway redis-server, a Redis Cluster of three masters
(started once per session), and the API served by a real uvicorn process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from offline.bench.lib.redis_cluster import RedisClusterProcesses
from offline.cli import main as seqrec
from service.http.settings import Settings
from service.http.store import HistoryStore, make_store
from tests import needs
from tests.service.support import (
    SHARED_REDIS,
    TINY_MODEL,
    RedisServer,
    Server,
    free_port,
    prepare_synthetic,
    serving,
    train_bundle,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_synthetic(tmp_path_factory.mktemp("data") / "synthetic")


@pytest.fixture(scope="session")
def bundle(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served bundle (retriever + LightGBM ranker). Never modified: tests that break bundles copy it."""
    return train_bundle(prepared, tmp_path_factory.mktemp("bundles") / "v1", seed=3)


@pytest.fixture(scope="session")
def featured(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny bundle whose model reads the synthetic catalogue's genres (so items added through the admin routes
    get a vector), with a LightGBM ranker. Never modified: tests copy it."""
    out = tmp_path_factory.mktemp("featured") / "v1"
    assert seqrec(["train", "--data", str(prepared), "--out", str(out), *TINY_MODEL, "--seed", "3",
                   "--model.item_features", "genres", "--train.repeats", "exclude", "-q"]) == 0
    assert seqrec(["train-ranker", "--artifact", str(out), "--data", str(prepared), "--kind", "lgbm", "--mining",
                   "direct", "--depth", "20", "--threads", "1", "-q"]) == 0
    return out


def _delete_prefix(prefix: str) -> None:
    with redis.Redis.from_url(SHARED_REDIS) as client:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique prefix on db 15 of the shared Redis; every key under it is deleted afterwards."""
    needs.shared_redis()
    prefix = f"seqrec-test:{uuid.uuid4().hex}:"
    yield prefix
    _delete_prefix(prefix)


@pytest.fixture(scope="module")
def module_redis_prefix() -> Iterator[str]:
    """``redis_prefix`` for a module-scoped server."""
    needs.shared_redis()
    prefix = f"seqrec-test:{uuid.uuid4().hex}:"
    yield prefix
    _delete_prefix(prefix)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    """Three masters, no replicas, nothing on disk: `redis-server --cluster-enabled yes` x 3 joined by
    `redis-cli --cluster create`, once `cluster_state:ok` on every node; stopped at the session's end."""
    needs.program("redis-server")
    needs.program("redis-cli")
    with RedisClusterProcesses(tmp_path_factory.mktemp("redis-cluster"), masters=3) as cluster:
        yield cluster


@pytest.fixture
def cluster_prefix(redis_cluster: RedisClusterProcesses) -> Iterator[str]:
    """A unique prefix on the session's cluster; every key under it is deleted afterwards, on every master."""
    prefix = f"seqrec-test:{uuid.uuid4().hex}:"
    yield prefix
    for node in redis_cluster.masters():
        with node.client() as client:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for key in keys:  # one by one: a node refuses a DEL of keys in several slots
                client.delete(key)


@pytest.fixture(params=["redis", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL, key prefix) of the shared Redis or of the session's Redis Cluster."""
    if request.param == "redis":
        return SHARED_REDIS, request.getfixturevalue("redis_prefix")
    return request.getfixturevalue("redis_cluster").url, request.getfixturevalue("cluster_prefix")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    needs.program("redis-server")
    server = RedisServer(free_port())
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def api(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The plain deployment: the bundle folder itself, in-process history store, no API key. Shared by the
    modules that only read from it or write under their own user ids."""
    with serving(tmp_path_factory.mktemp("api"), artifacts=str(bundle)) as server:
        yield server


StoreFactory = Callable[..., HistoryStore]


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
async def store_factory(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Makes history stores of one kind (the in-process one, one on the shared Redis or on the session's Redis
    Cluster, under a unique prefix); keyword arguments are settings (``seen_cap=3``). Every store made shares the
    one prefix, so two stores of a test see the same Redis data, as two service workers do."""
    made: list[HistoryStore] = []
    url: str | None = None
    prefix: str | None = None
    if request.param == "redis":
        url, prefix = SHARED_REDIS, request.getfixturevalue("redis_prefix")
    elif request.param == "redis-cluster":
        url, prefix = request.getfixturevalue("redis_cluster").url, request.getfixturevalue("cluster_prefix")

    def make(**settings: object) -> HistoryStore:
        if prefix is None:
            store = make_store(Settings(redis_url=None, **settings))  # type: ignore[arg-type]
        else:
            # a generous timeout: these tests check what the store keeps, not how fast (50 concurrent connects to
            # the shared Redis on a busy 2-core CI machine can take longer than the 250 ms default)
            store = make_store(Settings(redis_url=url, redis_prefix=prefix, redis_timeout_ms=5000,
                                        **settings))  # type: ignore[arg-type]
        assert store.name == request.param
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> HistoryStore:
    return store_factory()
