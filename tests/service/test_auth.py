"""With ``SEQREC_API_KEY`` set, writes, /admin and a user's stored history (read by path, or by POST /recommend
with a user_id) need ``Authorization: Bearer <key>``; the other reads stay open. (Without a key, nothing needs one:
`test_api.test_writes_need_no_key_when_none_is_set`.)"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from offline.bench.lib.processes import ServerError, UvicornProcess
from tests.service.support import Server, serving

KEY = "s3cret-key-0123456789"
WRONG = [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": KEY},
    {"Authorization": "Bearer"},
    {"X-Api-Key": KEY},
    {"Authorization": f"Bearer {KEY[:-1]}"},  # a prefix of the key, or another case, is another key
    {"Authorization": f"Bearer {KEY[:1]}"},
    {"Authorization": f"Bearer {KEY.upper()}"},
    {"Authorization": f"Bearer {KEY}é".encode()},  # bytes no key can match (it is printable ASCII): still a 401
    {"Authorization": f"Bearer {KEY}é".encode("latin-1")},
]
RIGHT = {"Authorization": f"Bearer {KEY}"}
READS_BY_POST = {"/recommend"}  # a query in a body: open unless it names a user (`test_recommend_by_user_...`)


@pytest.fixture(scope="module")
def client(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    server: Server
    with serving(tmp_path_factory.mktemp("key-api"), artifacts=str(bundle), api_key=KEY) as server, \
            server.client() as c:
        yield c


Write = Callable[[httpx.Client, dict[str, str]], httpx.Response]
WRITES: dict[str, Write] = {
    "events": lambda c, h: c.post("/events", json={"user_id": "alice", "item_id": "i1"}, headers=h),
    "event batch": lambda c, h: c.post("/events", json={"events": [{"user_id": "bob", "item_id": "i2"}]},
                                       headers=h),
    "delete history": lambda c, h: c.delete("/users/alice/history", headers=h),
    "reload": lambda c, h: c.post("/admin/reload", headers=h),
}


@pytest.mark.parametrize("write", list(WRITES.values()), ids=list(WRITES))
def test_writes_need_the_key(client: httpx.Client, write: Write) -> None:
    for headers in WRONG:
        response = write(client, headers)
        assert response.status_code == 401, (headers, response.text)
        assert "Authorization: Bearer" in response.json()["detail"]
        assert response.headers["www-authenticate"] == "Bearer"
    response = write(client, RIGHT)
    assert response.status_code == 200, response.text


def test_a_refused_write_stores_nothing(client: httpx.Client) -> None:
    assert client.post("/events", json={"user_id": "carol", "item_id": "i1"}).status_code == 401
    assert client.get("/users/carol/history", headers=RIGHT).json()["items"] == []
    assert client.post("/events", json={"user_id": "carol", "item_id": "i1"}, headers=RIGHT).status_code == 200
    assert client.delete("/users/carol/history").status_code == 401
    assert [e["item_id"] for e in client.get("/users/carol/history", headers=RIGHT).json()["items"]] == ["i1"]


def test_a_stored_history_needs_the_key(client: httpx.Client) -> None:
    """A history is personal data: GET /users/{id}/history was open, so anyone who guessed a user id read that
    user's items and timestamps."""
    assert client.post("/events", json={"user_id": "frank", "item_id": "i2", "timestamp": 1000},
                       headers=RIGHT).status_code == 200
    for method in ("GET", "HEAD"):
        for headers in WRONG:
            response = client.request(method, "/users/frank/history", headers=headers)
            assert response.status_code == 401, (method, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            assert "i2" not in response.text
    refused = client.get("/users/frank/history")
    assert refused.json()["detail"] == "this endpoint needs `Authorization: Bearer <SEQREC_API_KEY>`"
    response = client.get("/users/frank/history", headers=RIGHT)
    assert response.status_code == 200, response.text
    assert response.json() == {"user_id": "frank", "items": [{"item_id": "i2", "timestamp": 1000.0}]}
    # the unknown user and the malformed id get the 401 too: no answer tells whose history exists
    assert client.get("/users/nobody-at-all/history").status_code == 401
    assert client.get("/users/%FF/history").status_code == 401
    # the schema says so: the security scheme and the 401
    operation = client.get("/openapi.json").json()["paths"]["/users/{user_id}/history"]["get"]
    assert operation["security"] == [{"HTTPBearer": []}]
    assert "401" in operation["responses"]


def test_recommend_by_user_needs_the_key(client: httpx.Client) -> None:
    """A body with a user_id reads the user's stored history and seen set: POST /recommend was open, so a request
    with `include_items` of the whole catalogue, sent with `exclude_seen` true and then false, told exactly which items
    the user has seen (the difference) and `history_used` how many events are stored."""
    seen = ["i2", "i3", "i5"]
    events = [{"user_id": "grace", "item_id": item, "timestamp": 1000 + n} for n, item in enumerate(seen)]
    assert client.post("/events", json={"events": events}, headers=RIGHT).status_code == 200
    catalogue = [f"i{n}" for n in range(1, 31)]

    def ask(headers: dict[str, str], exclude_seen: bool, **body: object) -> httpx.Response:
        return client.post("/recommend", json={"user_id": "grace", "include_items": catalogue, "k": 1000,
                                               "exclude_seen": exclude_seen, **body}, headers=headers)

    for headers in WRONG:
        for exclude_seen in (True, False):
            # with a history as well: the rule is the user_id, not what the request reads
            for response in (ask(headers, exclude_seen), ask(headers, exclude_seen, history=["i1"])):
                assert response.status_code == 401, (headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.json() == {"detail": "this endpoint needs `Authorization: Bearer <SEQREC_API_KEY>`"}
    # with the key, the probe works as the review found it (so the 401s above hid exactly this)
    kept, every = (ask(RIGHT, exclude_seen) for exclude_seen in (True, False))
    assert kept.status_code == every.status_code == 200, (kept.text, every.text)
    returned = {i["item_id"] for i in every.json()["items"]} - {i["item_id"] for i in kept.json()["items"]}
    assert returned == set(seen)
    assert kept.json()["history_used"] == len(seen)
    assert ask(RIGHT, True, history=["i1"]).status_code == 200
    # a history alone needs no key, whatever it holds
    alone = client.post("/recommend", json={"history": seen, "include_items": catalogue, "k": 1000})
    assert alone.status_code == 200, alone.text
    assert alone.json()["history_used"] == len(seen)
    # the schema: the 401 (for a user_id), and the key as an option beside anonymous use
    operation = client.get("/openapi.json").json()["paths"]["/recommend"]["post"]
    assert "user_id" in operation["responses"]["401"]["description"]
    assert operation["security"] == [{"HTTPBearer": []}, {}]


def test_the_other_reads_need_no_key(client: httpx.Client) -> None:
    assert client.post("/events", json={"user_id": "dave", "item_id": "i3"}, headers=RIGHT).status_code == 200
    for response in (
        client.post("/recommend", json={"history": ["i1", "i2"], "k": 3}),
        client.get("/items", params={"query": "i1"}),
        client.get("/items/i1"),
        client.get("/healthz"),
        client.get("/readyz"),
        client.get("/metrics"),
        client.get("/openapi.json"),
        client.get("/"),
    ):
        assert response.status_code == 200, (response.request.url, response.text)


def test_validation_still_names_the_field_with_the_key(client: httpx.Client) -> None:
    response = client.post("/events", json={"user_id": "erin"}, headers=RIGHT)
    assert response.status_code == 422
    assert "EventIn.item_id" in response.json()["detail"]


def test_every_route_that_is_not_a_read_needs_the_key(client: httpx.Client) -> None:
    """Read from the served OpenAPI document, not from a list kept by hand: a router added to `ROUTERS` but not to
    `KEYED` (service/http/app.py) would serve its writes without the key. A stored history is read with the key too."""
    paths = client.get("/openapi.json").json()["paths"]
    writes = [(method, re.sub(r"\{[^}]+\}", "i1", path)) for path, operations in paths.items()
              for method in operations if (method not in ("get", "head") and path not in READS_BY_POST)
              or path == "/users/{user_id}/history"]
    assert {("post", "/events"), ("post", "/admin/items"), ("delete", "/admin/items/i1"),
            ("get", "/users/i1/history")} <= set(writes)
    for method, path in writes:
        for headers in WRONG:
            response = client.request(method.upper(), path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)


def test_a_path_id_is_checked_after_the_key(client: httpx.Client) -> None:
    """An id whose bytes are not UTF-8 was read as U+FFFD: this DELETE deleted user "\ufffd"'s history."""
    assert client.post("/events", json={"user_id": "\ufffd", "item_id": "i1"}, headers=RIGHT).status_code == 200
    assert client.delete("/users/%FF/history").status_code == 401
    response = client.delete("/users/%FF/history", headers=RIGHT)
    assert response.status_code == 422, response.text
    assert "path.user_id: not UTF-8" in response.json()["detail"]
    assert [e["item_id"] for e in client.get("/users/%EF%BF%BD/history", headers=RIGHT).json()["items"]] == ["i1"]


def test_a_key_no_header_carries_stops_the_server(bundle: Path, tmp_path: Path) -> None:
    """SEQREC_API_KEY='clé' served, and every write was 401: curl sends `Bearer cl\\xc3\\xa9`, which the server
    reads as Latin-1; only a client sending Latin-1 bytes got in, and browsers send neither."""
    server = Server(tmp_path, artifacts=str(bundle), api_key="clé").launch()
    try:
        with pytest.raises(ServerError, match="exited with code"):
            UvicornProcess.wait_ready(server, 90.0)
    finally:
        server.stop()
    assert "not printable ASCII" in server.log_text()
    assert "clé" not in server.log_text()  # a refused key stays out of the log
