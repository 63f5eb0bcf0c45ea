"""`seqrec rollback` over a real server: `current` switched back to the version published before, the server
reloaded, and the catalogue changes made meanwhile (the journal beside the versions) still served: an item retired
on the newer version stays retired on the older one (it came back when the journal lived inside each version)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from offline.cli import main as seqrec
from service.system.catalog import JOURNAL, LEGACY_JOURNAL, CatalogChanges, load_served, read_journal
from tests.service.support import point_current, serving

KEY = "rollback-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _versions(featured: Path, root: Path) -> tuple[Path, Path]:
    """Two published versions (copies of one bundle, published a day apart), `current` naming the newer."""
    old, new = (root / "versions" / f"2025010{day}T000000Z-tiny" for day in (1, 2))
    for day, version in enumerate((old, new), start=1):
        shutil.copytree(featured, version)
        (version / "pipeline.json").write_text(json.dumps({"published_at": f"2025-01-0{day}T00:00:00+00:00"}))
    point_current(root, new)
    return old, new


def _popular(client, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    answer = client.post("/recommend", json={"history": [], "k": n}).json()
    assert answer["fallback"] == "popularity"
    return [item["item_id"] for item in answer["items"]]


def test_a_rollback_keeps_retired_items_retired_and_reloads(featured: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "artifacts"
    old, new = _versions(featured, root)
    with serving(tmp_path / "api", artifacts=str(root), api_key=KEY) as server, \
            server.client(headers=AUTH) as client:
        top = _popular(client, 3)
        assert client.delete(f"/admin/items/{top[0]}").status_code == 200
        added = client.post("/admin/items", json={"items": [{"item_id": "fresh", "genres": ["Comedy"]}]})
        assert added.json()["items"][0]["retrievable"] is True
        assert (root / JOURNAL).is_file()
        assert not (new / JOURNAL).exists()
        assert not (old / JOURNAL).exists()

        assert seqrec(["rollback", "--artifacts", str(root), "--reload", server.url, "--api-key", KEY]) == 0
        assert f"current: {new.name} -> {old.name}" in capsys.readouterr().out
        assert (root / "current").resolve() == old.resolve()
        assert top[0] not in _popular(client, 10)  # retired on the newer version, still retired on the older
        assert client.get("/items/fresh").status_code == 200  # added on the newer version, served by the older
        assert client.get("/readyz").json()["n_items"] == load_served(old).n_items

        assert seqrec(["rollback", "--artifacts", str(root)]) == 1  # nothing was published before the oldest
        assert f"no version was published before {old.name}" in capsys.readouterr().err
        assert seqrec(["rollback", "--artifacts", str(root), "--to", "nope"]) == 1
        assert seqrec(["rollback", "--artifacts", str(root), "--to", new.name, "--reload", server.url,
                       "--api-key", KEY]) == 0
        assert (root / "current").resolve() == new.resolve()
        assert top[0] not in _popular(client, 10)
        errors = server.server_errors()
    assert not errors, "\n".join(errors)


def test_a_rollback_first_moves_a_journal_of_the_previous_format_beside_the_versions(featured: Path,
                                                                                     tmp_path: Path) -> None:
    """A version published by the previous release keeps its journal inside it: rolled back from as it is, its
    retirements would be lost, so the rollback writes that journal beside the versions before it switches."""
    root = tmp_path / "artifacts"
    old, new = _versions(featured, root)
    retired = str(load_served(new).external(int(load_served(new).popular[0])))
    (new / LEGACY_JOURNAL).write_text(CatalogChanges(retired=[retired]).model_dump_json())
    assert not (root / JOURNAL).exists()
    assert seqrec(["rollback", "--artifacts", str(root)]) == 0
    assert read_journal(old).retired == [retired]
    served = load_served(old)
    assert served.index_of[retired] in served.retired
