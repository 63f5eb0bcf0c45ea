"""``GET /items?query=&limit=``: catalogue search by id or title on the real server (the tiny bundle's catalogue
holds ids "i1".."i60" titled "Item 1".."Item 60")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.service.support import Server


@pytest.fixture(scope="module")
def client(api: Server) -> Iterator[httpx.Client]:
    with api.client() as c:
        yield c


@pytest.fixture(scope="module")
def titles(bundle: Path) -> dict[str, str]:
    """Served item id -> title, read from the bundle's catalogue."""
    rows = pq.read_table(bundle / "catalogue.parquet", columns=["item_id", "title"]).to_pylist()
    return {str(r["item_id"]): str(r["title"]) for r in rows}


def _search(client: httpx.Client, query: str | None, limit: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if query is not None:
        params["query"] = query
    if limit is not None:
        params["limit"] = limit
    response = client.get("/items", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_empty_query_lists_the_most_popular(client: httpx.Client) -> None:
    body = _search(client, None)
    assert body["query"] == ""
    assert len(body["items"]) == 20
    assert body["more"] is True
    assert [i["popularity_rank"] for i in body["items"]] == list(range(1, 21))
    top = client.post("/recommend", json={"k": 5}).json()  # no history: the popularity fallback
    assert [i["item_id"] for i in body["items"][:5]] == [i["item_id"] for i in top["items"]]


def test_title_search_is_case_insensitive_and_ordered_by_popularity(client: httpx.Client,
                                                                    titles: dict[str, str]) -> None:
    body = _search(client, "  ITEM 1", limit=100)
    found = [i["item_id"] for i in body["items"]]
    expected = {item for item, title in titles.items() if "item 1" in title.lower()}
    assert set(found) == expected
    assert len(found) == len(expected) > 1
    assert body["more"] is False
    ranks = [i["popularity_rank"] for i in body["items"]]
    assert ranks == sorted(ranks)
    first = body["items"][0]
    assert first["title"] == titles[first["item_id"]]
    assert isinstance(first["genres"], list)
    assert "year" in first


def test_exact_id_comes_first_then_id_prefixes(client: httpx.Client, titles: dict[str, str]) -> None:
    body = _search(client, "i1", limit=100)
    found = [i["item_id"] for i in body["items"]]
    assert found[0] == "i1"
    assert set(found) == {item for item in titles if item.startswith("i1")}
    assert client.get("/items/i1").json()["title"] == body["items"][0]["title"]


def test_limit_and_more(client: httpx.Client) -> None:
    body = _search(client, "Item", limit=3)
    assert len(body["items"]) == 3
    assert body["more"] is True
    assert _search(client, "no such thing")["items"] == []


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 101}, {"limit": "ten"}, {"query": "x" * 201}])
def test_bad_parameters_are_422(client: httpx.Client, params: dict[str, Any]) -> None:
    response = client.get("/items", params=params)
    assert response.status_code == 422
    name = next(iter(params))
    assert response.json()["errors"][0]["field"] == f"query.{name}"


def test_the_page_and_its_assets_are_served(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'src="static/app.js"' in page.text
    for asset, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        response = client.get(f"/static/{asset}")
        assert response.status_code == 200
        assert kind in response.headers["content-type"]
    assert "/" not in client.get("/openapi.json").json()["paths"]
