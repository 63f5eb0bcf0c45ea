"""Histories in a real Redis: the shared one at 127.0.0.1:6379 (db 15, a unique key prefix, keys deleted
afterwards), and a redis-server of this test's own that is killed and restarted under a running API."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.service.support import SHARED_REDIS, RedisServer, Server, serving


@pytest.fixture(scope="module")
def redis_api(bundle: Path, module_redis_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("redis-api"), artifacts=str(bundle), redis_url=SHARED_REDIS,
                 redis_prefix=module_redis_prefix) as server:
        yield server


def _items(response: httpx.Response) -> list[tuple[str, float]]:
    assert response.status_code == 200, response.text
    return [(i["item_id"], i["score"]) for i in response.json()["items"]]


def test_events_then_recommend_by_user_id(redis_api: Server, module_redis_prefix: str) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    with redis_api.client() as client:
        ready = client.get("/readyz").json()
        assert ready["status"] == "ready"
        assert ready["store"] == {"kind": "redis", "reachable": True, "writable": True}

        assert client.post("/events", json={"user_id": user, "item_id": "i1", "timestamp": 10}).status_code == 200
        batch = {"events": [{"user_id": user, "item_id": i} for i in ("i2", "i3", "i999")]}
        assert client.post("/events", json=batch).json() == {"stored": 3, "users": 1, "unknown_items": ["i999"]}

        # what the service wrote is in Redis, under the configured prefix and the user's tag, one JSON entry per event
        with redis.Redis.from_url(SHARED_REDIS) as raw:
            entries = [json.loads(e) for e in raw.lrange(f"{module_redis_prefix}{{{user}}}:history", 0, -1)]
        assert entries == [{"i": "i1", "t": 10.0}, {"i": "i2"}, {"i": "i3"}, {"i": "i999"}]
        assert [e["item_id"] for e in client.get(f"/users/{user}/history").json()["items"]] == [
            "i1", "i2", "i3", "i999"]

        by_user = client.post("/recommend", json={"user_id": user, "k": 5})
        assert by_user.json()["history_used"] == 3
        assert by_user.json()["unknown_items"] == ["i999"]
        assert _items(by_user) == _items(client.post("/recommend", json={"history": ["i1", "i2", "i3"], "k": 5}))

        # trimmed to the model's max_len in Redis too
        many = {"events": [{"user_id": user, "item_id": f"i{n}"} for n in range(10, 30)]}
        assert client.post("/events", json=many).status_code == 200
        stored = [e["item_id"] for e in client.get(f"/users/{user}/history").json()["items"]]
        assert stored == [f"i{n}" for n in range(30 - ready["max_len"], 30)]

        assert client.delete(f"/users/{user}/history").json()["deleted"] is True
        assert client.post("/recommend", json={"user_id": user}).json()["fallback"] == "popularity"


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _unready(response: httpx.Response) -> dict[str, Any]:
    """/readyz while the store cannot take writes: 503, so a load balancer's readiness check fails."""
    assert response.status_code == 503, response.text
    body: dict[str, Any] = response.json()
    return body


def _unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["detail"] == "history store unavailable, retry later: Redis is unreachable"
    assert "127.0.0.1" not in response.text  # the address goes to the server's log, not to clients
    assert response.headers["retry-after"] == "1"
    assert response.elapsed.total_seconds() < 2.0  # fails fast, no long retry loop


def test_redis_killed_and_restarted(bundle: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    with serving(tmp_path / "api", artifacts=str(bundle), redis_url=redis_server.url,
                 redis_timeout_ms="250") as api, api.client() as client:
        event = {"user_id": "u1", "item_id": "i5"}
        _ok(client.post("/events", json=event))
        _ok(client.post("/events", json={"user_id": "u1", "item_id": "i7"}))
        before = _items(client.post("/recommend", json={"user_id": "u1", "k": 5}))

        redis_server.kill()
        # an explicit history needs no store: still answered, the same as with the stored one
        assert _items(client.post("/recommend", json={"history": ["i5", "i7"], "k": 5})) == before
        _unavailable(client.post("/recommend", json={"user_id": "u1", "k": 5}))
        _unavailable(client.post("/events", json=event))
        _unavailable(client.post("/events", json={"events": [event, {"user_id": "u2", "item_id": "i1"}]}))
        _unavailable(client.get("/users/u1/history"))
        _unavailable(client.delete("/users/u1/history"))
        ready = _unready(client.get("/readyz"))
        assert ready["status"] == "degraded"
        assert ready["store"] == {"kind": "redis", "reachable": False, "writable": False}
        assert "path" not in ready
        assert "127.0.0.1" not in json.dumps(ready)
        assert client.get("/healthz").status_code == 200

        # the same port again (an empty Redis: nothing on disk); the API recovers at once, without a restart
        redis_server.start()
        assert _ok(client.get("/readyz"))["status"] == "ready"
        _ok(client.post("/events", json={"user_id": "u1", "item_id": "i9"}))
        assert [e["item_id"] for e in _ok(client.get("/users/u1/history"))["items"]] == ["i9"]
        answer = _ok(client.post("/recommend", json={"user_id": "u1", "k": 5}))
        assert answer["history_used"] == 1
        assert answer["fallback"] is None
        assert _ok(client.delete("/users/u1/history"))["deleted"] is True


def test_a_full_redis_makes_readyz_degraded_not_writable(bundle: Path, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    """maxmemory reached under noeviction: Redis still answers PING and reads, so `/readyz` used to say ready
    while every event got 503. It now says degraded with writable false (a 503), and ready again once Redis has
    room."""
    with serving(tmp_path / "api", artifacts=str(bundle), redis_url=redis_server.url,
                 redis_timeout_ms="1000") as api, api.client() as client:
        _ok(client.post("/events", json={"user_id": "u1", "item_id": "i5"}))
        admin = redis.Redis.from_url(redis_server.url)
        try:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")
            refused = client.post("/events", json={"user_id": "u1", "item_id": "i7"})
            assert refused.status_code == 503, refused.text
            assert "refuses writes" in refused.json()["detail"]
            ready = _unready(client.get("/readyz"))
            assert ready["status"] == "degraded"
            assert ready["store"] == {"kind": "redis", "reachable": True, "writable": False}
            assert _ok(client.post("/recommend", json={"user_id": "u1", "k": 5}))["history_used"] == 1

            admin.config_set("maxmemory", "0")
            ready = _ok(client.get("/readyz"))
            assert ready["status"] == "ready"
            assert ready["store"] == {"kind": "redis", "reachable": True, "writable": True}
            _ok(client.post("/events", json={"user_id": "u1", "item_id": "i7"}))
        finally:
            admin.close()


def test_errors_redis_answers_are_503_naming_them_not_500(bundle: Path, redis_server: RedisServer,
                                                           tmp_path: Path) -> None:
    """Started without `seqrec serve`'s check (uvicorn's app factory), on a database number Redis lacks and on an
    ACL without the prefix's keys: the store's routes were 500s with a traceback; they are the store's 503."""
    admin = redis.Redis.from_url(redis_server.url)
    try:
        admin.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~other:*", "+@all")
        port = redis_server.port
        cases = [(f"redis://127.0.0.1:{port}/99", "refused the request: DB index is out of range"),
                 (f"redis://narrow:pw@127.0.0.1:{port}/0", "refused the request: ")]
        for i, (url, reason) in enumerate(cases):
            with serving(tmp_path / f"api{i}", artifacts=str(bundle), redis_url=url,
                         redis_timeout_ms="1000") as api, api.client() as client:
                for response in (client.post("/events", json={"user_id": "u1", "item_id": "i5"}),
                                 client.post("/recommend", json={"user_id": "u1", "k": 5}),
                                 client.get("/users/u1/history")):
                    assert response.status_code == 503, response.text
                    assert reason in response.json()["detail"]
                    assert "pw@" not in response.json()["detail"]
                assert _items(client.post("/recommend", json={"history": ["i5"], "k": 5}))  # no store needed
                assert _unready(client.get("/readyz"))["status"] == "degraded"
    finally:
        admin.close()


def test_a_key_another_program_wrote_is_a_409_that_a_delete_clears(redis_api: Server, module_redis_prefix: str) -> None:
    """A string where the user's list should be (WRONGTYPE) was a 503 "retry later" that no retry could cure."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(SHARED_REDIS)
    try:
        admin.set(f"{module_redis_prefix}{{{user}}}:history", "not a list")
        with redis_api.client() as client:
            for response in (client.get(f"/users/{user}/history"),
                             client.post("/recommend", json={"user_id": user, "k": 3}),
                             client.post("/events", json={"user_id": user, "item_id": "i1"})):
                assert response.status_code == 409, response.text
                detail = response.json()["detail"]
                assert detail.startswith(f"the stored history of user {user!r} (keys {module_redis_prefix}*) holds "
                                         "values seqrec did not write")
                assert detail.endswith("; DELETE /users/{user_id}/history clears it")
            # all or nothing: the batch's other user, queued first, is not stored (it was, in a MULTI block)
            batch = client.post("/events", json={"events": [{"user_id": f"{user}-other", "item_id": "i1"},
                                                            {"user_id": user, "item_id": "i1"}]})
            assert batch.status_code == 409, batch.text
            assert batch.json()["detail"].startswith(f"the stored history of user {user!r} (keys")
            assert client.get(f"/users/{user}-other/history").json()["items"] == []
            assert client.get("/readyz").json()["status"] == "ready"
            assert client.delete(f"/users/{user}/history").json()["deleted"] is True
            assert _ok(client.post("/events", json={"user_id": user, "item_id": "i1"}))["stored"] == 1
    finally:
        admin.delete(*(f"{module_redis_prefix}{{{who}}}:{kind}" for kind in ("history", "seen", "cut", "cut_at")
                       for who in (user, f"{user}-other")))
        admin.close()
