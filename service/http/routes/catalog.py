"""``POST /admin/items`` (add items without retraining) and ``DELETE /admin/items/{item_id}`` (retire one).

The change is made under the journal's lock (one at a time across worker processes), checked against the served
bundle with the journal on disk applied, applied to a copy of it (`service.system.catalog`), written to the bundle's
journal and only then swapped in, so a failed write changes nothing, no worker's change overwrites another's,
and a restart serves what every worker answered. The other workers serve the journal within one reload poll
(`service.http.reloading.watch_current`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow.parquet as pq
from fastapi import APIRouter, HTTPException

from retriever.artifact import CATALOGUE
from service.http.deps import EngineDep
from service.http.schemas import (
    CONFLICT,
    INVALID,
    JOURNAL_DOWN,
    TOO_LARGE,
    UNKNOWN_ITEM,
    UNREADABLE,
    AddItemsRequest,
    CatalogueChangeResponse,
    PathId,
    RetireResponse,
)
from service.system.bundle import Bundle, BundleError
from service.system.catalog import (
    CatalogChanges,
    apply_changes,
    catalogue_vocabulary,
    feature_column,
    journal_lock,
    pending,
    synced,
    write_journal,
)

log = logging.getLogger("seqrec.service")

keyed = APIRouter()


@keyed.post("/admin/items", response_model=CatalogueChangeResponse, response_model_exclude_none=True,
            responses={**UNREADABLE, **INVALID, **TOO_LARGE, **CONFLICT, **JOURNAL_DOWN})
async def add_items(body: AddItemsRequest, engine: EngineDep) -> dict[str, Any]:
    rows = [item.model_dump(exclude_none=True) for item in body.items]
    _check_columns(engine.bundle, rows)

    def change(served: Bundle) -> Bundle:
        with _journal(served) as bundle:
            changes = bundle.changes or CatalogChanges()
            taken = {*bundle.index_of, *changes.added_ids}
            clash = [row["item_id"] for row in rows if row["item_id"] in taken]
            if clash:
                raise HTTPException(409, f"already in the catalogue: {', '.join(map(repr, clash[:5]))}")
            return _commit(bundle, changes.model_copy(update={"added": [*changes.added, *rows]}))

    _, new = await engine.update(change)
    log.info("catalogue: %d items added (%s)", len(rows), new.version)
    return {**_summary(new), "items": [_added(new, row) for row in rows]}


@keyed.delete("/admin/items/{item_id:id}", response_model=RetireResponse,
              responses={**INVALID, **UNKNOWN_ITEM, **JOURNAL_DOWN})
async def retire_item(item_id: PathId, engine: EngineDep) -> dict[str, Any]:
    already = False

    def change(served: Bundle) -> Bundle:
        nonlocal already
        with _journal(served) as bundle:
            changes = bundle.changes or CatalogChanges()
            if item_id not in bundle.index_of and item_id not in changes.added_ids:
                raise HTTPException(404, f"item {item_id!r} is not in the catalogue of model {bundle.version}")
            if item_id in changes.retired:
                already = True
                return bundle
            return _commit(bundle, changes.model_copy(update={"retired": [*changes.retired, item_id]}))

    _, new = await engine.update(change)
    return {"item_id": item_id, "retired": True, "already": already, "model_version": new.version}


@contextmanager
def _journal(served: Bundle) -> Iterator[Bundle]:
    """Under the journal's lock, the served bundle with what other workers wrote to the journal applied: a change
    starts from the journal on disk, never from one worker's copy, so no worker's change is written over."""
    try:
        with journal_lock(served.path):
            yield synced(served)
    except (OSError, BundleError) as err:
        raise HTTPException(503, f"cannot use the catalogue journal beside {served.path}: {err}") from None


def _commit(bundle: Bundle, changes: CatalogChanges) -> Bundle:
    """The bundle with ``changes`` applied, once they are safely in the journal."""
    new = apply_changes(bundle, changes)
    try:
        write_journal(bundle.path, changes)
    except OSError as err:
        raise HTTPException(503, f"cannot write the catalogue journal beside {bundle.path}: {err}") from None
    return new


def _check_columns(bundle: Bundle, rows: list[dict[str, Any]]) -> None:
    """409 for an id twice in the request and for a column the served catalogue does not have: the body is
    valid, but conflicts with the catalogue being served (whose columns the schema cannot know)."""
    file = bundle.path / CATALOGUE
    columns = set(pq.read_schema(file).names) - {"item_idx", "item_id"} if file.is_file() else set()
    problems = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        if row["item_id"] in seen:
            problems.append(f"items.{i}.item_id: {row['item_id']!r} appears twice in the request")
        seen.add(row["item_id"])
        problems += [f"items.{i}.{column}: the served catalogue has no column {column!r} (its columns: "
                     f"{', '.join(sorted(columns)) or 'none'})" for column in sorted(set(row) - {"item_id"} - columns)]
    if problems:
        raise HTTPException(409, "; ".join(problems[:10]))


def _added(bundle: Bundle, row: dict[str, Any]) -> dict[str, Any]:
    column = feature_column(bundle)
    if column is None:
        return {"item_id": row["item_id"], "retrievable": False, "known_features": 0,
                "reason": "the model has no item features: the item is served after the next training"}
    values = row.get(column) or []
    known = len(set(map(str, values)) & set(catalogue_vocabulary(bundle, column)))
    retrievable = row["item_id"] in bundle.index_of
    reason = None if retrievable else (f"none of its {column!r} values is known to the model: the item is "
                                       "served after the next training")
    return {"item_id": row["item_id"], "retrievable": retrievable, "known_features": known, "reason": reason}


def _summary(bundle: Bundle) -> dict[str, Any]:
    retired = 0 if bundle.changes is None else len(bundle.changes.retired)
    return {"model_version": bundle.version, "n_items": bundle.n_items, "pending": len(pending(bundle)),
            "retired": retired}
