"""With ``SEQREC_API_KEY`` set, writes, /admin and a user's stored history need ``Authorization: Bearer <key>``;
the other reads stay open. (Without a key, nothing needs one: `test_api.test_writes_need_no_key_when_none_is_set`.)"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from offline.bench.processes import ServerError, UvicornProcess
from tests.service.support import Server, serving

KEY = "s3cret-key"
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
READS_BY_POST = {"/recommend"}  # a query in a body: open, as every read but a stored history is


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


def test_the_other_reads_need_no_key(client: httpx.Client) -> None:
    assert client.post("/events", json={"user_id": "dave", "item_id": "i3"}, headers=RIGHT).status_code == 200
    for response in (
        client.post("/recommend", json={"history": ["i1", "i2"], "k": 3}),
        client.post("/recommend", json={"user_id": "dave", "k": 3}),
        client.get("/items", params={"query": "i1"}),
        client.get("/items/i1"),
        client.get("/healthz"),
        client.get("/readyz"),
        client.get("/metrics"),
        client.get("/openapi.json"),
        client.get("/"),
    ):
        assert response.status_code == 200, (response.request.url, response.text)
    assert client.post("/recommend", json={"user_id": "dave"}).json()["history_used"] == 1


def test_validation_still_names_the_field_with_the_key(client: httpx.Client) -> None:
    response = client.post("/events", json={"user_id": "erin"}, headers=RIGHT)
    assert response.status_code == 422
    assert "EventIn.item_id" in response.json()["detail"]


def test_every_route_that_is_not_a_read_needs_the_key(client: httpx.Client) -> None:
    """Read from the served OpenAPI document, not from a list kept by hand: a router added to `ROUTERS` but not to
    `KEYED` (service/app.py) would serve its writes without the key. A stored history is read with the key too."""
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
