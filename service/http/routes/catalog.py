"""``POST /admin/items`` (add items without retraining) and ``DELETE /admin/items/{item_id}`` (retire one).

The change is made under the journal's lock (one at a time across worker processes), checked against the served
bundle with the journal on disk applied, applied to a copy of it (`service.system.catalog`), appended to the
journal and only then swapped in, so a failed write changes nothing, no worker's change overwrites another's,
and a restart serves what every worker answered. The other workers serve the journal within one reload poll
(`service.http.reloading.watch_current`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq
from fastapi import APIRouter, HTTPException

from retriever.artifact import CATALOGUE
from service.http.deps import EngineDep
from service.http.engine import Engine
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
from service.system.catalog import CatalogChanges, catalogue_vocabulary, commit, feature_column, journal_lock, synced

log = logging.getLogger("seqrec.service")

keyed = APIRouter()


@keyed.post("/admin/items", response_model=CatalogueChangeResponse, response_model_exclude_none=True,
            responses={**UNREADABLE, **INVALID, **TOO_LARGE, **CONFLICT, **JOURNAL_DOWN})
async def add_items(body: AddItemsRequest, engine: EngineDep) -> dict[str, Any]:
    rows = [item.model_dump(exclude_none=True) for item in body.items]
    _check_columns(engine.bundle, rows)

    def change(bundle: Bundle, changes: CatalogChanges) -> Bundle:
        clash = [i for i in (row["item_id"] for row in rows) if i in bundle.index_of or changes.is_added(i)]
        if clash:
            raise HTTPException(409, f"already in the catalogue: {', '.join(map(repr, clash[:5]))}")
        return _commit(bundle, {"added": rows})

    new = await _change(engine, change)
    log.info("catalogue: %d items added (%s)", len(rows), new.version)
    return {**_summary(new), "items": [_added(new, row) for row in rows]}


@keyed.delete("/admin/items/{item_id:id}", response_model=RetireResponse,
              responses={**INVALID, **UNKNOWN_ITEM, **JOURNAL_DOWN})
async def retire_item(item_id: PathId, engine: EngineDep) -> dict[str, Any]:
    already = False

    def change(bundle: Bundle, changes: CatalogChanges) -> Bundle:
        nonlocal already
        if item_id not in bundle.index_of and not changes.is_added(item_id):
            raise HTTPException(404, f"item {item_id!r} is not in the catalogue of model {bundle.version}")
        if changes.is_retired(item_id):
            already = True
            return bundle
        return _commit(bundle, {"retired": [item_id]})

    new = await _change(engine, change)
    return {"item_id": item_id, "retired": True, "already": already, "model_version": new.version}


async def _change(engine: Engine, change: Callable[[Bundle, CatalogChanges], Bundle]) -> Bundle:
    """Run ``change`` under the journal's lock on the served bundle with what other workers journalled applied (a
    change starts from the journal on disk, never from one worker's copy, so no worker's change is written over).
    That bundle is served from then on even when ``change`` refuses (its HTTPException is raised after the swap):
    it is what the journal holds."""
    refused: HTTPException | None = None

    def locked(served: Bundle) -> Bundle:
        nonlocal refused
        try:
            with journal_lock(served.path):
                bundle = synced(served)
                try:
                    return change(bundle, bundle.changes or CatalogChanges())
                except HTTPException as err:
                    refused = err
                    return bundle
        except (OSError, BundleError) as err:
            raise HTTPException(503, f"cannot use the catalogue journal beside {served.path}: {err}") from None

    _, new = await engine.update(locked)
    if refused is not None:
        raise refused
    return new


def _commit(bundle: Bundle, record: dict[str, Any]) -> Bundle:
    """The bundle with ``record`` applied, once it is safely appended to the journal."""
    try:
        return commit(bundle, record)
    except OSError as err:
        raise HTTPException(503, f"cannot write the catalogue journal beside {bundle.path}: {err}") from None


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
    return {"model_version": bundle.version, "n_items": bundle.n_items, "pending": bundle.pending_count,
            "retired": retired}
