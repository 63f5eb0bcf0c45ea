"""What the pipeline does with the served bundle's catalogue changes (`service.catalog`) and warm starts.

* ``take_added_items``: after ``prepare``, the items added through ``POST /admin/items`` since the served
  bundle was published join the prepared catalogue (items.parquet, with their columns), so the next
  training gives them item rows (and interactions, when the source data has some by then).
* ``carry_retired``: before ``publish``, the retired ids go into the new bundle's journal, so what was
  retired stays out of what is served.
* ``served_bundle``: the bundle ``ARTIFACTS/current`` names, for ``warm_start``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from offline.data.prepare import _write_atomically
from offline.data.prepared import ITEMS, SEQUENCES, USERS, load_prepared
from offline.jobs.versions import CURRENT
from service.catalog import CatalogChanges, read_journal, write_journal

log = logging.getLogger(__name__)


def served_bundle(artifacts: Path) -> Path | None:
    current = artifacts / CURRENT
    return current.resolve() if (current / "manifest.json").is_file() else None


def served_changes(artifacts: Path) -> CatalogChanges:
    bundle = served_bundle(artifacts)
    return CatalogChanges() if bundle is None else read_journal(bundle)


def take_added_items(artifacts: Path, data_dir: Path) -> dict[str, Any]:
    """Append the served bundle's added items that the prepared folder lacks to its items.parquet."""
    changes = served_changes(artifacts)
    if not changes.added:
        return {}
    data = load_prepared(data_dir)
    known = set(data.items.column("item_id").to_pylist())
    rows = [item for item in changes.added if str(item["item_id"]) not in known]
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
    return {"added_items": len(rows)}


def carry_retired(artifacts: Path, bundle: Path) -> dict[str, Any]:
    """Write the served bundle's retired ids into ``bundle``'s journal (nothing when there are none)."""
    retired = served_changes(artifacts).retired
    if not retired:
        return {}
    write_journal(bundle, CatalogChanges(retired=list(retired)))
    return {"retired_items": len(retired)}


def _cell(row: dict[str, Any], column: str) -> Any:
    return str(row["item_id"]) if column == "item_id" else row.get(column)
