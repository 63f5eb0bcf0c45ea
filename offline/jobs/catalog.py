"""What the pipeline does with the served bundle's catalogue changes (`service.system.catalog`) and warm starts.

* ``take_added_items``: after ``prepare``, the items added through ``POST /admin/items`` since the served
  bundle was published join the prepared catalogue (items.parquet, with their columns), so the next
  training gives them item rows (and interactions, when the source data has some by then).
* ``carry_changes``: before ``publish``, a served bundle's journal of the previous format (inside the bundle) is
  written beside the versions, where the new version reads it, so what was retired stays out of what is served
  and nothing added is lost (a journal already beside the versions needs nothing).
* ``served_bundle``: the bundle ``ARTIFACTS/current`` names, for ``warm_start``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offline.data.prepare import _write_atomically
from offline.data.prepared import ITEMS, SEQUENCES, USERS, load_prepared
from offline.jobs.versions import CURRENT
from retriever.artifact import CATALOGUE, ITEM_IDS
from service.system.catalog import CatalogChanges, journal_lock, read_journal, write_journal
from service.system.journal import journal_file, journal_home

log = logging.getLogger(__name__)


def served_bundle(artifacts: Path) -> Path | None:
    current = artifacts / CURRENT
    return current.resolve() if (current / "manifest.json").is_file() else None


def served_changes(artifacts: Path) -> CatalogChanges:
    bundle = served_bundle(artifacts)
    return CatalogChanges() if bundle is None else read_journal(bundle)


def take_added_items(artifacts: Path, data_dir: Path) -> dict[str, Any]:
    """Append to the prepared items.parquet the items added through ``POST /admin/items`` that it lacks: those
    the served bundle's journal holds, and those an earlier run took in (``admin_items`` of the served bundle's
    pipeline.json, with their catalogue rows), less retired ones. Returns the stage's record, ``admin_items``
    naming every such item the new bundle holds: the source data never has them, so without it an added item
    was gone after its second retraining."""
    served = served_bundle(artifacts)
    if served is None:
        return {}
    changes = read_journal(served)
    offered = {str(row["item_id"]): row for row in [*_admin_items(served), *changes.added]}
    if not offered:
        return {}
    data = load_prepared(data_dir)
    known = set(data.items.column("item_id").to_pylist())
    retired = set(changes.retired)
    rows = [row for item_id, row in offered.items() if item_id not in known and item_id not in retired]
    if not rows:
        return {"added_items": 0}
    items = data.items
    start = items.num_rows + 1
    new = {name: [(start + i if name == "item_idx" else _cell(row, name)) for i, row in enumerate(rows)]
           for name in items.column_names}
    items = pa.concat_tables([items, pa.table({n: pa.array(v, type=items.schema.field(n).type)
                                               for n, v in new.items()})])
    sequences = pq.read_table(data_dir / SEQUENCES)
    users = pq.read_table(data_dir / USERS) if (data_dir / USERS).exists() else None
    manifest = {**{k: v for k, v in data.manifest.items() if k != "sha256"}, "items": items.num_rows,
                "added_items": [str(row["item_id"]) for row in rows]}
    _write_atomically(data_dir, {SEQUENCES: sequences, ITEMS: items, USERS: users}, manifest)
    log.info("%d items added through POST /admin/items join the catalogue", len(rows))
    return {"added_items": len(rows), "admin_items": [str(row["item_id"]) for row in rows]}


def _admin_items(served: Path) -> list[dict[str, Any]]:
    """The catalogue rows of the items the served bundle took in from ``POST /admin/items`` (none for a bundle
    published before pipeline.json named them)."""
    record = served / "pipeline.json"
    ids = json.loads(record.read_text()).get("stages", {}).get("prepare", {}).get("admin_items", []) \
        if record.is_file() else []
    if not ids or not (served / CATALOGUE).is_file():
        return []
    catalogue = pq.read_table(served / CATALOGUE)
    rows = catalogue.filter(pc.is_in(catalogue.column("item_id"), value_set=pa.array(ids, pa.string())))
    return [{k: v for k, v in row.items() if k != "item_idx"} for row in rows.to_pylist()]


def adopt_legacy_journal(artifacts: Path) -> CatalogChanges | None:
    """Write the served bundle's journal of the previous format (inside the bundle) beside the versions, where every
    version reads it, when no journal is there yet; returns what was written (None when nothing was). Before a
    publish or a rollback: the version switched to has no such file, and would serve retired items again."""
    served = served_bundle(artifacts)
    if served is None or journal_home(served) != artifacts.resolve() or journal_file(served).exists():
        return None
    with journal_lock(served):
        changes = read_journal(served)  # the previous format's, unless a server has just written the new one
        if journal_file(served).exists() or not (changes.added or changes.retired):
            return None
        write_journal(served, changes)
    log.info("catalogue journal of %s written beside the versions (%s)", served.name, journal_file(served))
    return changes


def carry_changes(artifacts: Path, bundle: Path) -> dict[str, Any]:
    """Before ``bundle`` is published into ARTIFACTS/versions: it reads the journal beside the versions, as every
    version does, so nothing needs copying but a journal of the previous format (`adopt_legacy_journal`). Returns
    what was carried ({} when nothing was)."""
    changes = adopt_legacy_journal(artifacts)
    if changes is None:
        return {}
    trained = set(np.load(bundle / ITEM_IDS, allow_pickle=False).tolist())
    pending = [item for item in changes.added if str(item["item_id"]) not in trained]
    return {"retired_items": len(changes.retired), "pending_items": len(pending)}


def _cell(row: dict[str, Any], column: str) -> Any:
    return str(row["item_id"]) if column == "item_id" else row.get(column)
