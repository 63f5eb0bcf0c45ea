"""Catalogue changes without retraining, over real HTTP (a uvicorn process) with a real Redis: `POST /admin/items`
gives a model with item features vectors for new items at once, `DELETE /admin/items/{id}` retires one, and
both survive a restart and a reload (the journal beside the bundle)."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from offline.cli import main as seqrec
from retriever.artifact import rewrite_index
from retriever.index import IndexSpec, search
from service.system.catalog import (
    JOURNAL,
    LEGACY_JOURNAL,
    CatalogChanges,
    apply_changes,
    apply_records,
    load_served,
    read_journal,
)
from service.system.loader import load_bundle
from tests.service.support import SHARED_REDIS, Server, serving

KEY = "catalogue-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def served_copy(featured: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(featured, tmp_path / "bundle"))


def _everything(client, history: list[str], n: int) -> list[str]:  # type: ignore[no-untyped-def]
    r = client.post("/recommend", json={"history": history, "k": n, "candidates": n, "rerank": True})
    assert r.status_code == 200, r.text
    return [item["item_id"] for item in r.json()["items"]]


def test_added_items_are_served_at_once_and_retired_ones_never(served_copy: Path, tmp_path: Path,
                                                                  module_redis_prefix: str) -> None:
    settings = {"artifacts": str(served_copy), "api_key": KEY, "redis_url": SHARED_REDIS,
                "redis_prefix": module_redis_prefix}
    with serving(tmp_path / "a", **settings) as server, server.client(headers=AUTH) as client:
        ready = client.get("/readyz").json()
        n = ready["n_items"]
        popular = [i["item_id"] for i in client.get("/items", params={"limit": 3}).json()["items"]]
        assert server.client().post("/admin/items", json={"items": [{"item_id": "x"}]}).status_code == 401
        r = client.post("/admin/items", json={"items": [{"item_id": "new-1", "genres": ["Comedy", "Drama"],
                                                         "title": "New one"},
                                                        {"item_id": "new-2", "genres": ["No such genre"]}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [i["retrievable"] for i in body["items"]] == [True, False]
        assert body["items"][0]["known_features"] == 2
        assert (body["n_items"], body["pending"]) == (n + 1, 1)
        assert client.get("/items/new-1").json()["genres"] == ["Comedy", "Drama"]
        history = ["i1", "i2", "i3"]
        assert "new-1" in _everything(client, history, n + 1)  # in the index: every item is returned
        assert "new-2" not in _everything(client, history, n + 1)
        r = client.post("/recommend", json={"history": ["new-1", "i1"], "k": 5})
        assert r.json()["unknown_items"] == []  # read in histories
        assert client.delete(f"/admin/items/{popular[0]}").json() == {
            "item_id": popular[0], "retired": True, "already": False, "model_version": ready["model_version"]}
        assert client.delete(f"/admin/items/{popular[0]}").json()["already"] is True
        ranks = {i["item_id"]: i["popularity_rank"] for q in popular[:2]
                 for i in client.get("/items", params={"query": q}).json()["items"] if i["item_id"] == q}
        assert ranks == {popular[0]: 1, popular[1]: 2}  # the retired item's was 0; nobody else's shifts
        _check_served(client, n, popular[0])
        server.stop()
        server.start()  # a restart serves the same catalogue
        _check_served(client, n, popular[0])
        assert client.post("/admin/reload").status_code == 200
        _check_served(client, n, popular[0])
    assert (served_copy / JOURNAL).is_file()


def _check_served(client, n: int, retired: str) -> None:  # type: ignore[no-untyped-def]
    listed = _everything(client, ["i1", "i2", "i3"], n + 1)
    assert "new-1" in listed
    assert retired not in listed
    assert len(listed) == n + 1 - 3 - 1  # everything but the history and the retired item
    fallback = client.post("/recommend", json={"history": [], "k": n + 1}).json()
    assert fallback["fallback"] == "popularity"
    assert retired not in [i["item_id"] for i in fallback["items"]]
    r = client.post("/recommend", json={"history": [retired, "i1"], "k": 5})
    assert r.json()["unknown_items"] == []  # a retired item is still read in histories
    assert retired not in [i["item_id"] for i in r.json()["items"]]


def test_every_worker_serves_and_keeps_every_workers_changes(served_copy: Path, tmp_path: Path,
                                                             module_redis_prefix: str) -> None:
    """Two workers (the default with Redis on two cores): each wrote the journal whole from its own copy, so
    retirements answered by one worker were lost when the other wrote (gone after a restart), the other worker
    kept serving retired items, and an id added through one could be added again through the other."""
    server = Server(tmp_path / "w", artifacts=str(served_copy), api_key=KEY, redis_url=SHARED_REDIS,
                    redis_prefix=module_redis_prefix, workers="2", reload_poll_s="0.2")
    server.workers = 2
    server.start()
    try:
        with server.client(headers={**AUTH, "Connection": "close"}) as client:  # new connections: both workers
            _both_workers_ready(client)  # `start` returns once the first is; the second may still be loading
            n = client.get("/readyz").json()["n_items"]
            retired = [f"i{i}" for i in range(10, 22)]
            for item in retired:
                r = client.delete(f"/admin/items/{item}")
                assert (r.status_code, r.json()["already"]) == (200, False), r.text
            assert client.post("/admin/items", json={"items": [{"item_id": "new-1"}]}).status_code == 200
            assert read_journal(served_copy).retired == retired
            for _ in range(12):  # the changes need no poll to be seen by a change
                assert client.post("/admin/items", json={"items": [{"item_id": "new-1"}]}).status_code == 409
                assert client.delete(f"/admin/items/{retired[0]}").json()["already"] is True
            time.sleep(1.0)  # five polls: each worker serves the journal
            # 40 rounds at least, more until both workers have answered one (a new connection goes to whichever
            # worker accepts first: on a busy host one worker took all 40 once)
            workers, rounds, deadline = set(), 0, time.monotonic() + 30
            while rounds < 40 or (len(workers) < 2 and time.monotonic() < deadline):
                workers.add(client.get("/readyz").json()["worker"])
                assert not set(retired) & set(_everything(client, ["i1"], n))
                rounds += 1
            assert len(workers) == 2, f"one worker answered all {rounds} rounds"
        server.stop()
        server.start()
        with server.client() as client:  # after a restart, every retirement still holds
            assert not set(retired) & set(_everything(client, ["i1"], n))
        errors = server.server_errors()
    finally:
        server.stop()
    assert not errors, "\n".join(errors)


def _both_workers_ready(client, wait_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    seen: set[int] = set()
    deadline = time.monotonic() + wait_s
    while len(seen) < 2 and time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            seen.add(client.get("/readyz").json()["worker"])
        time.sleep(0.05)
    assert len(seen) == 2, f"one worker answered in {wait_s:g} s"


def test_bad_changes_are_4xx_and_change_nothing(served_copy: Path, tmp_path: Path) -> None:
    with serving(tmp_path / "b", artifacts=str(served_copy)) as server, server.client() as client:
        n = client.get("/readyz").json()["n_items"]
        cases = [
            ({"items": []}, 422),
            ({"items": [{"item_id": "a", "attributes": ["x"]}]}, 409),  # not a column of this catalogue
            ({"items": [{"item_id": "a"}, {"item_id": "a"}]}, 409),
            ({"items": [{"item_id": "a", "genres": "Comedy"}]}, 422),
            ({"items": [{"item_id": "a", "colour": "red"}]}, 422),
            ({"items": [{"item_id": "i1", "genres": ["Comedy"]}]}, 409),  # already in the catalogue
        ]
        for body, status in cases:
            r = client.post("/admin/items", json=body)
            assert r.status_code == status, (body, r.text)
        assert client.delete("/admin/items/nope").status_code == 404
        assert client.post("/admin/items", content=b"{", headers={"content-type": "application/json"}
                           ).status_code == 422
        assert client.get("/readyz").json()["n_items"] == n
    assert not (served_copy / JOURNAL).exists()


def test_a_model_without_item_features_keeps_added_items_pending(bundle: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(bundle, tmp_path / "plain"))
    with serving(tmp_path / "c", artifacts=str(copy)) as server, server.client() as client:
        r = client.post("/admin/items", json={"items": [{"item_id": "fresh", "genres": ["Comedy"]}]})
        assert r.status_code == 200, r.text
        (item,) = r.json()["items"]
        assert not item["retrievable"]
        assert "next training" in item["reason"]
        assert r.json()["pending"] == 1
        r = client.post("/recommend", json={"history": ["fresh", "i1"], "k": 5})
        assert r.json()["unknown_items"] == ["fresh"]


def _borrowed(encoder, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The mean over ``ids`` (non-zero feature values) of the mean ID row of the trained items having each."""
    trained = encoder.item_features[1:]
    means = [encoder.item_emb.weight[1:][(trained == v).any(1)].mean(0) for v in ids.tolist()]
    return torch.stack(means).mean(0)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_a_new_item_vector_is_its_feature_mean_plus_a_borrowed_id_part_and_the_index_finds_it(
        served_copy: Path, kind: str) -> None:
    rewrite_index(served_copy, IndexSpec(kind=kind))
    base = load_bundle(served_copy)
    changes = CatalogChanges(added=[{"item_id": "n", "genres": ["Comedy", "Drama"]}], retired=["i1"])
    bundle = apply_changes(base, changes)
    encoder = base.artifact.model.encoder
    assert bundle.n_items == base.n_items + 1
    row = bundle.n_items
    ids = bundle.artifact.model.encoder.item_features[row]
    ids = ids[ids != 0]
    features = encoder.feature_emb(ids).mean(0)  # type: ignore[misc]
    weight = base.artifact.config.model.added_id_weight
    assert weight > 0
    with torch.no_grad():
        expected = features + weight * _borrowed(encoder, ids)
        assert torch.allclose(bundle.vectors[row], torch.nn.functional.normalize(expected, dim=0), atol=1e-5)
        plain = apply_changes(base, changes, id_weight=0.0)  # no ID part: the feature mean alone
        assert torch.allclose(plain.vectors[row], torch.nn.functional.normalize(features, dim=0), atol=1e-6)
    assert torch.equal(bundle.vectors[: row], base.vectors)  # trained items unchanged
    _, rows = search(bundle.artifact.index, bundle.vectors[row : row + 1].numpy(), 1)
    assert rows[0, 0] == row - 1  # index row r = internal id r + 1
    assert bundle.index_of["i1"] in bundle.retired
    assert bundle.index_of["i1"] not in bundle.popular.tolist()
    assert base.n_items == len(base.artifact.item_ids)  # the loaded bundle itself is untouched
    (served_copy / LEGACY_JOURNAL).write_text(changes.model_dump_json())  # the previous format still loads
    again = load_served(served_copy)
    assert np.array_equal(again.vectors.numpy(), bundle.vectors.numpy())


def test_an_added_items_vector_does_not_depend_on_what_was_added_before_it(served_copy: Path) -> None:
    base = load_bundle(served_copy)
    first, second = {"item_id": "a", "genres": ["Comedy"]}, {"item_id": "b", "genres": ["Comedy", "Drama"]}
    one_by_one = apply_records(apply_changes(base, CatalogChanges(added=[first])), [{"added": [second]}], None)
    at_once = apply_changes(base, CatalogChanges(added=[first, second]))
    alone = apply_changes(base, CatalogChanges(added=[second]))
    assert torch.equal(one_by_one.vectors, at_once.vectors)
    assert torch.allclose(at_once.vectors[-1], alone.vectors[-1], atol=1e-6)


def test_an_export_keeps_the_catalogue_changes_a_server_makes_meanwhile(served_copy: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`seqrec export` copied the bundle, built the index for seconds, then swapped the copy in: retirements a
    server journaled in between were lost (acknowledged, then recommended again after the reload)."""
    from retriever import artifact
    from service.system.catalog import journal_lock, write_journal

    write_journal(served_copy, CatalogChanges(retired=["i1"]))
    build = artifact.build_index

    def retire_while_building(*args, **kwargs):  # type: ignore[no-untyped-def]
        with journal_lock(served_copy):  # as a server's DELETE /admin/items/i2 does, mid-export
            write_journal(served_copy, CatalogChanges(retired=["i1", "i2"]))
        return build(*args, **kwargs)

    monkeypatch.setattr(artifact, "build_index", retire_while_building)
    assert seqrec(["export", "--artifact", str(served_copy), "--index", "flat", "-q"]) == 0
    assert read_journal(served_copy).retired == ["i1", "i2"]
    assert load_served(served_copy).retired == {load_served(served_copy).index_of[i] for i in ("i1", "i2")}
