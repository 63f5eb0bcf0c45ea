"""Business filters in POST /recommend over real HTTP, against real FAISS (flat and HNSW): never an ineligible
item, exactly k whenever k eligible items exist (reranked or not), 422 for a filter the catalogue cannot answer."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from offline.cli import main as seqrec
from retriever.artifact import rewrite_index
from retriever.index import IndexSpec
from tests.service.support import Server, serving

Row = dict[str, Any]


def _catalogue(bundle: Path) -> dict[str, Row]:
    return {r["item_id"]: r for r in pq.read_table(bundle / "catalogue.parquet").to_pylist()}


def _histories(prepared: Path, n: int) -> list[list[str]]:
    lists = pq.read_table(prepared / "sequences.parquet").column("items").to_pylist()
    return [list(h) for h in lists[:n]]


# (request fields, the same condition written out by hand over a catalogue row)
CASES: list[tuple[dict[str, Any], Callable[[Row], bool]]] = [
    ({"filters": {"genres": ["Comedy", "Drama"]}}, lambda r: bool({"Comedy", "Drama"} & set(r["genres"]))),
    ({"filters": {"genres": {"ne": "Comedy"}}}, lambda r: "Comedy" not in r["genres"]),
    ({"filters": {"year": {"gte": 1990, "lt": 2010}}}, lambda r: r["year"] is not None and 1990 <= r["year"] < 2010),
    ({"filters": {"year": [1980, 1999, 2001]}}, lambda r: r["year"] in (1980, 1999, 2001)),
    ({"filters": {"year": {"gt": 1975}, "genres": "Drama"}},
     lambda r: r["year"] is not None and r["year"] > 1975 and "Drama" in r["genres"]),
    ({"filters": {"year": {"ne": 2000}}}, lambda r: r["year"] is not None and r["year"] != 2000),
    ({"filters": {"year": {"lte": 1980}}}, lambda r: r["year"] is not None and r["year"] <= 1980),
]


def _check(server: Server, catalogue: dict[str, Row], histories: list[list[str]], fields: dict[str, Any],
           keep: Callable[[Row], bool], *, k: int, rerank: bool = True) -> None:
    eligible = {i for i, r in catalogue.items() if keep(r)}
    with server.client() as client:
        for history in histories:
            response = client.post("/recommend", json={"history": history, "k": k, "rerank": rerank, **fields})
            assert response.status_code == 200, response.text
            got = [item["item_id"] for item in response.json()["items"]]
            assert set(got) <= eligible, f"{fields}: returned ineligible {set(got) - eligible}"
            assert not set(got) & set(history)  # the bundle's repeat policy is exclude
            assert len(got) == min(k, len(eligible - set(history))), fields


@pytest.mark.parametrize("rerank", [True, False])
def test_attribute_filters_hold_and_fill_k(api: Server, bundle: Path, prepared: Path, rerank: bool) -> None:
    catalogue, histories = _catalogue(bundle), _histories(prepared, 12)
    for fields, keep in CASES:
        _check(api, catalogue, histories, fields, keep, k=10, rerank=rerank)


def test_include_and_exclude_items(api: Server, bundle: Path, prepared: Path) -> None:
    catalogue, histories = _catalogue(bundle), _histories(prepared, 8)
    ids = sorted(catalogue)
    allow, deny = set(ids[:25]), set(ids[::3])
    _check(api, catalogue, histories, {"include_items": sorted(allow)}, lambda r: r["item_id"] in allow, k=10)
    _check(api, catalogue, histories, {"exclude_items": sorted(deny)}, lambda r: r["item_id"] not in deny, k=10)
    _check(api, catalogue, histories, {"include_items": sorted(allow), "exclude_items": sorted(deny),
                                       "filters": {"genres": {"in": ["Comedy", "Action", "Drama"]}}},
           lambda r: r["item_id"] in allow - deny and bool({"Comedy", "Action", "Drama"} & set(r["genres"])), k=10)


def test_unknown_item_ids_are_reported_not_refused(api: Server, prepared: Path) -> None:
    history = _histories(prepared, 1)[0]
    with api.client() as client:
        body = client.post("/recommend", json={"history": history, "exclude_items": ["nope", history[0]],
                                               "include_items": ["gone", 123]}).json()
    assert body["unknown_items"] == ["gone", "123", "nope"]
    assert body["items"] == []  # nothing known is allowed


def test_cold_start_answer_is_filtered_too(api: Server, bundle: Path) -> None:
    catalogue = _catalogue(bundle)
    eligible = {i for i, r in catalogue.items() if "Drama" in r["genres"]}
    with api.client() as client:
        body = client.post("/recommend", json={"history": [], "k": 5, "filters": {"genres": ["Drama"]}}).json()
    assert body["fallback"] == "popularity"
    got = [item["item_id"] for item in body["items"]]
    assert set(got) <= eligible
    assert len(got) == min(5, len(eligible))


@pytest.mark.parametrize(("filters", "field"), [
    ({"colour": ["red"]}, "filters.colour"),
    ({"year": {"around": 1990}}, "filters.year.around"),
    ({"year": {"gte": "1990"}}, "filters.year.gte"),
    ({"year": {"in": 1990}}, "filters.year.in"),
    ({"genres": {"gte": "Drama"}}, "filters.genres.gte"),
    ({"genres": {"eq": 3}}, "filters.genres.eq"),
    ({"title": {"in": []}}, "filters.title.in"),
])
def test_bad_filters_are_422_naming_the_field(api: Server, filters: dict[str, Any], field: str) -> None:
    with api.client() as client:
        response = client.post("/recommend", json={"history": ["i1"], "filters": filters})
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


def test_empty_conditions_and_absent_columns(api: Server, bundle: Path, prepared: Path) -> None:
    """{} is no condition; a column this catalogue lacks (the synthetic one has no attributes) matches nothing."""
    history = _histories(prepared, 1)[0]
    with api.client() as client:
        plain = client.post("/recommend", json={"history": history}).json()["items"]
        empty = client.post("/recommend", json={"history": history, "filters": {"genres": {}}}).json()["items"]
        absent = client.post("/recommend", json={"history": history, "filters": {"attributes": ["x"]}})
    assert [i["item_id"] for i in empty] == [i["item_id"] for i in plain]
    assert absent.status_code == 200
    assert absent.json()["items"] == []


def test_malformed_filter_values_are_422(api: Server) -> None:
    with api.client() as client:
        for body in ({"filters": {"year": {"gte": True}}}, {"filters": ["year"]}, {"exclude_items": "i1"},
                     {"filters": {"year": {"gte": {"deep": 1}}}}):
            response = client.post("/recommend", json={"history": ["i1"], **body})
            assert response.status_code == 422, (body, response.text)


@pytest.fixture(scope="module")
def large_trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A retriever-only bundle over ~2,700 items, so that permissive filters (over `EXACT_MAX` rows) go through the
    FAISS selector and restrictive ones through the exact scan."""
    root = tmp_path_factory.mktemp("large")
    data, bundle = root / "data", root / "bundle"
    assert seqrec(["prepare", "--dataset", "synthetic", "--n-users", "800", "--n-items", "8000", "--mean-length", "8",
                   "--seed", "1", "--out", str(data), "-q"]) == 0
    assert seqrec(["train", "--data", str(data), "--out", str(bundle), "--model.d_model", "16", "--model.n_layers",
                   "1", "--model.n_heads", "2", "--model.max_len", "10", "--train.epochs", "1", "--train.batch_size",
                   "256", "--threads", "1", "--seed", "3", "--train.repeats", "exclude", "-q"]) == 0
    return data, bundle


@pytest.fixture(scope="module", params=["flat", "hnsw"])
def large(request: pytest.FixtureRequest, large_trained: tuple[Path, Path],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, Path]]:
    """That bundle served from a flat or an HNSW index (a small efSearch: filtered walks come back short)."""
    data, trained = large_trained
    root = tmp_path_factory.mktemp(f"large-{request.param}")
    bundle = root / "bundle"
    shutil.copytree(trained, bundle)
    if request.param == "hnsw":
        rewrite_index(bundle, IndexSpec(kind="hnsw", hnsw_m=8, ef_construction=40, ef_search=16))
    with serving(root / "server", artifacts=str(bundle)) as server:
        yield server, data, bundle


def test_large_catalogue_filters_through_the_index(large: tuple[Server, Path, Path]) -> None:
    server, data, bundle = large
    catalogue = _catalogue(bundle)
    histories = _histories(data, 10)
    years = sorted(r["year"] for r in catalogue.values() if r["year"] is not None)
    permissive, median = years[len(years) // 20], years[len(years) // 2]  # keeps ~95 %: the FAISS selector answers
    for fields, keep in [
        ({"filters": {"year": {"gte": permissive}}}, lambda r: r["year"] is not None and r["year"] >= permissive),
        ({"filters": {"genres": ["Western"], "year": {"gte": median}}},
         lambda r: "Western" in r["genres"] and r["year"] is not None and r["year"] >= median),
        *CASES[:3],
    ]:
        _check(server, catalogue, histories, fields, keep, k=50)
