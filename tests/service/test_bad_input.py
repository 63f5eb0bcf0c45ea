"""Client mistakes get a 4xx that says what is wrong (422 naming the field, 413 for a body over 1 MiB), never a
5xx, and leave stored histories as they were."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.service.support import Server, metric_samples

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(api: Server) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


def _check(response: httpx.Response, status: int, *fields: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    for field in fields:
        assert f"{field}:" in body["detail"], (field, body["detail"])
    if status == 422:
        assert {e["field"] for e in body["errors"]} >= set(fields)
    return body


RECOMMEND_422: list[tuple[str, Any, tuple[str, ...]]] = [
    ("k=0", {"history": ["i1"], "k": 0}, ("k",)),
    ("k=1001", {"history": ["i1"], "k": 1001}, ("k",)),
    ("k=-3", {"history": ["i1"], "k": -3}, ("k",)),
    ("k=2.5", {"history": ["i1"], "k": 2.5}, ("k",)),
    ("k huge", {"history": ["i1"], "k": 10**30}, ("k",)),
    ("k text", {"history": ["i1"], "k": "x"}, ("k",)),
    ("k null", {"history": ["i1"], "k": None}, ("k",)),
    ("candidates=0", {"history": ["i1"], "candidates": 0}, ("candidates",)),
    ("candidates=2001", {"history": ["i1"], "candidates": 2001}, ("candidates",)),
    ("history string", {"history": "abc"}, ("history",)),
    ("history object", {"history": {"i1": 1}}, ("history",)),
    ("history of objects", {"history": [{}]}, ("history.0",)),
    ("history of lists", {"history": ["i1", ["i2"]]}, ("history.1",)),
    ("history of floats", {"history": ["i1", 1.5]}, ("history.1",)),
    ("history of bools", {"history": [True]}, ("history.0",)),
    ("history of nulls", {"history": [None]}, ("history.0",)),
    ("empty item id", {"history": [""]}, ("history.0",)),
    ("item id too long", {"history": ["x" * 257]}, ("history.0",)),
    ("history too long", {"history": ["i1"] * 10_001}, ("history",)),
    ("user_id number", {"user_id": 5}, ("user_id",)),
    ("user_id empty", {"user_id": ""}, ("user_id",)),
    ("exclude_seen text", {"history": ["i1"], "exclude_seen": "maybe"}, ("exclude_seen",)),
    ("rerank list", {"history": ["i1"], "rerank": []}, ("rerank",)),
    ("unknown field", {"history": ["i1"], "kk": 5}, ("kk",)),
    ("two mistakes", {"k": "x", "foo": 1}, ("k", "foo")),
    ("body is a list", ["i1", "i2"], ("body",)),
    ("body is a string", "i1", ("body",)),
    ("body is null", None, ("body",)),
]


@pytest.mark.parametrize(("body", "fields"), [(b, f) for _, b, f in RECOMMEND_422],
                         ids=[name for name, _, _ in RECOMMEND_422])
def test_recommend_rejects(client: httpx.Client, body: Any, fields: tuple[str, ...]) -> None:
    _check(client.post("/recommend", json=body), 422, *fields)


RAW_422 = [
    ("malformed JSON", b'{"history": ["i1"], "k":', "body", "malformed JSON"),
    ("trailing comma", b'{"history": ["i1"],}', "body", "malformed JSON"),
    ("single quotes", b"{'history': ['i1']}", "body", "malformed JSON"),
    ("empty body", b"", "body", "required"),
    ("lone surrogate in an id", b'{"history": ["\\ud800"]}', "history.0", "surrogate"),
]


@pytest.mark.parametrize(("raw", "field", "words"), [(r, f, w) for _, r, f, w in RAW_422],
                         ids=[name for name, *_ in RAW_422])
def test_recommend_rejects_raw_bodies(client: httpx.Client, raw: bytes, field: str, words: str) -> None:
    body = _check(client.post("/recommend", content=raw, headers=JSON), 422, field)
    assert words in body["detail"]


def test_non_json_content(client: httpx.Client) -> None:
    _check(client.post("/recommend", content=b"history=i1", headers={"content-type": "text/plain"}), 422, "body")
    _check(client.post("/recommend", data={"history": "i1"}), 422, "body")  # a form
    # undecodable or absurdly nested JSON: FastAPI's own 400
    for raw in (b'\xff\xfe{"history": []}', b'{"history": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        response = client.post("/recommend", content=raw, headers=JSON)
        assert response.status_code == 400, response.text
        assert "parsing the body" in response.json()["detail"]


def test_body_over_one_mib(client: httpx.Client) -> None:
    padding = b" " * (1 << 20)
    response = client.post("/recommend", content=b'{"history": ["i1"]' + padding + b"}", headers=JSON)
    assert response.status_code == 413
    # without a Content-Length (chunked): counted as it streams in

    def chunks() -> Iterator[bytes]:
        yield b'{"history": ["i1"]'
        for _ in range(20):
            yield b" " * 65536
        yield b"}"

    assert client.post("/recommend", content=chunks(), headers=JSON).status_code == 413
    assert client.post("/events", content=b'{"user_id": "u"' + padding + b"}", headers=JSON).status_code == 413
    # just under the limit is fine
    assert client.post("/recommend", content=b'{"history": ["i1"]' + padding[:-1024] + b"}",
                       headers=JSON).status_code == 200


EVENTS_422: list[tuple[str, Any, tuple[str, ...]]] = [
    ("no item", {"user_id": "u"}, ("EventIn.item_id",)),
    ("no user", {"item_id": "i1"}, ("EventIn.user_id",)),
    ("empty user", {"user_id": "", "item_id": "i1"}, ("EventIn.user_id",)),
    ("negative timestamp", {"user_id": "u", "item_id": "i1", "timestamp": -1}, ("EventIn.timestamp",)),
    ("timestamp text", {"user_id": "u", "item_id": "i1", "timestamp": "yesterday"}, ("EventIn.timestamp",)),
    ("timestamp in ms", {"user_id": "u", "item_id": "i1", "timestamp": 1.7e12}, ("EventIn.timestamp",)),
    ("item object", {"user_id": "u", "item_id": {"id": 1}}, ("EventIn.item_id",)),
    ("unknown field", {"user_id": "u", "item_id": "i1", "rating": 5}, ("EventIn.rating",)),
    ("empty batch", {"events": []}, ("EventBatch.events",)),
    ("batch too large", {"events": [{"user_id": "u", "item_id": "i1"}] * 1001}, ("EventBatch.events",)),
    ("bad event in a batch", {"events": [{"user_id": "u", "item_id": "i1"}, {"user_id": "u"}]},
     ("EventBatch.events.1.item_id",)),
    ("events not a list", {"events": "i1"}, ("EventBatch.events",)),
]


@pytest.mark.parametrize(("body", "fields"), [(b, f) for _, b, f in EVENTS_422],
                         ids=[name for name, _, _ in EVENTS_422])
def test_events_reject(client: httpx.Client, body: Any, fields: tuple[str, ...]) -> None:
    _check(client.post("/events", json=body), 422, *fields)


def test_events_reject_raw_bodies(client: httpx.Client) -> None:
    _check(client.post("/events", content=b'{"user_id": "u", "item_id": "i1", "timestamp": NaN}', headers=JSON),
           422, "EventIn.timestamp")
    _check(client.post("/events", content=b'{"user_id": "u", "item_id": "i1", "timestamp": Infinity}',
                       headers=JSON), 422, "EventIn.timestamp")
    _check(client.post("/events", content=b'{"user_id": "\\udfff", "item_id": "i1"}', headers=JSON), 422,
           "EventIn.user_id")
    _check(client.post("/events", content=b'{"user_id": "u", "item_id": ', headers=JSON), 422, "body")
    _check(client.post("/events", content=b"", headers=JSON), 422, "body")


def test_bad_events_leave_the_stored_history_intact(client: httpx.Client) -> None:
    user = f"user-{uuid.uuid4().hex[:12]}"
    good = [{"user_id": user, "item_id": "i1", "timestamp": 1.0}, {"user_id": user, "item_id": "i2"}]
    assert client.post("/events", json={"events": good}).status_code == 200
    before = client.get(f"/users/{user}/history").json()
    assert [e["item_id"] for e in before["items"]] == ["i1", "i2"]
    bad_posts = [
        {"events": [{"user_id": user, "item_id": "i3"}, {"user_id": user, "item_id": "i4", "timestamp": -5}]},
        {"events": [{"user_id": user, "item_id": "i3"}, {"user_id": "", "item_id": "i4"}]},
        {"user_id": user, "item_id": "i3", "extra": True},
        {"user_id": user, "item_id": ["i3"]},
    ]
    for body in bad_posts:
        assert client.post("/events", json=body).status_code == 422, body
    assert client.post("/events", content=b'{"user_id": "' + user.encode() + b'", "item_id": "i3"',
                       headers=JSON).status_code == 422
    assert client.get(f"/users/{user}/history").json() == before


def test_paths(client: httpx.Client) -> None:
    long_user = "x" * 300
    _check(client.get(f"/users/{long_user}/history"), 422, "path.user_id")
    _check(client.delete(f"/users/{long_user}/history"), 422, "path.user_id")
    assert client.get("/items/" + "x" * 300).status_code == 422
    assert client.get("/items/%00").status_code == 404
    assert client.get("/no/such/route").status_code == 404
    assert client.put("/recommend", json={}).status_code == 405
    assert client.get("/recommend").status_code == 405


NOT_UTF8 = ["%FF", "%FE", "%C0%80", "%ED%A0%80", "a%E9b"]  # then an overlong NUL, a surrogate, Latin-1 é


def test_path_ids_that_are_not_utf8_are_422(client: httpx.Client) -> None:
    """The server decoded each bad byte as U+FFFD: /users/%FF/history and /users/%FE/history read (and a DELETE
    would have deleted) the history of user "\ufffd", which the JSON bodies alone could name."""
    user = f"\ufffd-{uuid.uuid4().hex[:12]}"
    suffix = user[1:]
    assert client.post("/events", json={"user_id": user, "item_id": "i1"}).status_code == 200
    for bad in NOT_UTF8:
        for method, path, field in [("GET", f"/users/{bad}{suffix}/history", "path.user_id"),
                                    ("DELETE", f"/users/{bad}{suffix}/history", "path.user_id"),
                                    ("HEAD", f"/users/{bad}/history", None),
                                    ("GET", f"/items/{bad}", "path.item_id"),
                                    ("DELETE", f"/admin/items/{bad}", "path.item_id")]:
            response = client.request(method, path)
            assert response.status_code == 422, (method, path, response.text)
            if field is not None:
                body = _check(response, 422, field)
                assert "not UTF-8" in body["detail"]
                assert body["errors"][0]["type"] == "string_unicode"
    # U+FFFD sent as its own UTF-8 bytes is that id, as in a body
    history = client.get(f"/users/%EF%BF%BD{suffix}/history")
    assert history.status_code == 200, history.text
    assert (history.json()["user_id"], [e["item_id"] for e in history.json()["items"]]) == (user, ["i1"])
    assert client.delete(f"/users/%EF%BF%BD{suffix}/history").json() == {"user_id": user, "deleted": True}
    assert client.get("/items/%EF%BF%BD").status_code == 404  # no such item, but a valid id
    assert client.get("/users/caf%C3%A9/history").json() == {"user_id": "café", "items": []}


def test_query_values_that_are_not_utf8_are_422(client: httpx.Client) -> None:
    """The server decoded each bad byte as U+FFFD: /items?query=%FF searched for U+FFFD, as the path ids did."""
    for bad in NOT_UTF8:
        body = _check(client.get(f"/items?query={bad}"), 422, "query.query")
        assert "not UTF-8" in body["detail"]
        assert body["errors"][0]["type"] == "string_unicode"
        assert client.get(f"/items?limit=3&{bad}=1").status_code == 422  # a parameter's name too
    # valid UTF-8, percent-encoded or as U+FFFD's own bytes, is searched as sent
    found = client.get("/items?query=caf%C3%A9&limit=3")
    assert found.status_code == 200, found.text
    assert found.json()["query"] == "café"
    assert client.get("/items?query=%EF%BF%BD").json()["query"] == "\ufffd"


def test_no_5xx_so_far(client: httpx.Client) -> None:
    """Everything above (and whatever ran before on this server) answered below 500."""
    requests = metric_samples(client.get("/metrics").text, "seqrec_requests_total")
    assert requests, "no request counts in /metrics"
    errors = {labels: n for labels, n in requests.items() if 'status="5' in labels}
    assert not errors


def _bound_keys(node: Any, path: str = "") -> list[str]:
    """Paths of schema nodes that carry pydantic's constraint names (ge, gt, le, lt) instead of JSON Schema's."""
    found: list[str] = []
    if isinstance(node, dict):
        if "type" in node and {"ge", "gt", "le", "lt"} & node.keys():
            found.append(path)
        for key, value in node.items():
            if key != "properties" or not isinstance(value, dict):
                found += _bound_keys(value, f"{path}/{key}")
            else:  # property names such as a filter's `gt` are names, not constraints
                found += [p for name, sub in value.items() for p in _bound_keys(sub, f"{path}/properties/{name}")]
    elif isinstance(node, list):
        found += [p for i, item in enumerate(node) for p in _bound_keys(item, f"{path}/{i}")]
    return found


def test_every_bound_in_the_openapi_schema_is_a_json_schema_keyword(client: httpx.Client) -> None:
    """A bound written as `ge`/`le` is ignored by schema readers (clients, the fuzzer), which then send -1 as a valid
    year and get a 422: the published schema must state what validation enforces."""
    schema = client.get("/openapi.json").json()
    assert _bound_keys(schema) == []
    year = schema["components"]["schemas"]["NewItem"]["properties"]["year"]["anyOf"][0]
    assert (year["minimum"], year["maximum"]) == (0, 10_000)
