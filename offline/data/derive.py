"""Prepared folders derived from another one, for the catalogue and retraining measurements.

* ``hold_out_items``: a share of the catalogue (drawn uniformly, seeded) is removed from the
  catalogue and every one of its interactions is removed from every sequence, so a model trained
  on the result has never seen those items, not even as validation targets. Their catalogue
  rows (e.g. Beauty's ``attributes``) are written beside it, to be added later through
  ``POST /admin/items``. Users left with fewer than three interactions are dropped.
* ``time_prefix``: each user's first ``share`` of their *training* positions (all but the last
  two) followed by their validation and test items, i.e. the data as it stood earlier, evaluated
  on the same targets: the "yesterday" half of a nightly warm-start retraining.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import SeqrecError
from offline.data.prepare import _lists, _write_atomically
from offline.data.prepared import FORMAT, ITEMS, SEQUENCES, USERS, PreparedDataset
from offline.data.split import MIN_LENGTH

HELD_OUT = "held_out_items.parquet"


def hold_out_items(data: PreparedDataset, out: Path, share: float, seed: int) -> dict[str, Any]:
    """Write ``out/train`` (a prepared folder without the held-out items) and ``out/held_out_items.parquet``."""
    if not 0 < share < 1:
        raise SeqrecError(f"--share must lie in (0, 1), got {share}")
    n_held = max(1, round(share * data.n_items))
    held = np.sort(np.random.default_rng(seed).choice(np.arange(1, data.n_items + 1), size=n_held, replace=False))
    keep_item = np.ones(data.n_items + 1, dtype=bool)
    keep_item[held] = False
    seqs = data.sequences
    user = np.repeat(np.arange(len(seqs)), seqs.lengths)
    kept = keep_item[seqs.items]
    lengths = np.bincount(user[kept], minlength=len(seqs))
    keep_user = lengths >= MIN_LENGTH
    table = _sequence_table(data)
    mask = kept & keep_user[user]
    offsets = np.concatenate([[0], np.cumsum(lengths[keep_user])]).astype(np.int64)
    rows = _replace_lists(table, np.flatnonzero(keep_user), offsets, mask)
    items = data.items.filter(pa.array(keep_item[1:]))
    items = items.set_column(0, "item_idx", pa.array(np.arange(1, items.num_rows + 1, dtype=np.int64)))
    users = data.users.take(pa.array(np.flatnonzero(keep_user))) if data.users is not None else None
    extra = {"derived_from": _origin(data), "held_out": {"share": share, "seed": seed, "items": int(n_held),
                                                          "users_dropped": int((~keep_user).sum())}}
    manifest = _write(out / "train", data, rows, items, users, extra)
    held_rows = data.items.take(pa.array(held - 1)).drop_columns(["item_idx"])
    _write_table(out / HELD_OUT, held_rows)
    record = {"source": str(data.path), "share": share, "seed": seed, "held_out_items": int(n_held),
              "train_users": manifest["users"], "train_items": manifest["items"],
              "train_interactions": manifest["interactions"], "users_dropped": int((~keep_user).sum())}
    (out / "holdout.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def time_prefix(data: PreparedDataset, out: Path, share: float) -> dict[str, Any]:
    """Write ``out``: each user's first floor(share * n_train) training positions, then valid and test."""
    if not 0 < share <= 1:
        raise SeqrecError(f"--share must lie in (0, 1], got {share}")
    seqs = data.sequences
    n_train = seqs.lengths - 2
    kept_train = np.maximum(1, np.floor(share * n_train + 1e-9).astype(np.int64))
    position = np.arange(len(seqs.items)) - np.repeat(seqs.offsets[:-1], seqs.lengths)
    user = np.repeat(np.arange(len(seqs)), seqs.lengths)
    mask = (position < kept_train[user]) | (position >= n_train[user])
    lengths = kept_train + 2
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = _replace_lists(_sequence_table(data), np.arange(len(seqs)), offsets, mask)
    extra = {"derived_from": _origin(data), "time_prefix": {"share": share}}
    return _write(out, data, rows, data.items, data.users, extra)


def _sequence_table(data: PreparedDataset) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(data.path / SEQUENCES)


def _replace_lists(table: pa.Table, users: np.ndarray, offsets: np.ndarray, mask: np.ndarray) -> pa.Table:
    """Rows ``users`` of ``table`` with each list column cut to its ``mask``-ed values (``mask`` runs over
    the whole table's flattened lists and is False for every value of a user not in ``users``)."""
    rows = table.take(pa.array(users))
    for name in ("items", "timestamps"):
        if name not in table.column_names:
            continue
        values = table.column(name).combine_chunks().flatten().filter(pa.array(mask))
        small = offsets[-1] < np.iinfo(np.int32).max
        rows = rows.set_column(rows.column_names.index(name), name,
                               _lists(offsets.astype(np.int32) if small else offsets, values))
    return rows


def _write(out: Path, data: PreparedDataset, sequences: pa.Table, items: pa.Table, users: pa.Table | None,
           extra: dict[str, Any]) -> dict[str, Any]:
    interactions = int(pc.sum(pc.list_value_length(sequences.column("items"))).as_py())
    manifest = {
        **{k: v for k, v in data.manifest.items() if k not in ("sha256", "created_at")},
        "format": FORMAT, "users": sequences.num_rows, "items": items.num_rows, "interactions": interactions,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"), **extra,
    }
    sequences = sequences.set_column(0, "user_idx", pa.array(np.arange(sequences.num_rows, dtype=np.int64)))
    if users is not None:
        users = users.set_column(0, "user_idx", pa.array(np.arange(users.num_rows, dtype=np.int64)))
    manifest.pop("repeat_targets", None)  # recomputed by the loader when asked
    _write_atomically(out, {SEQUENCES: sequences, ITEMS: items, USERS: users}, manifest)
    return manifest


def _write_table(path: Path, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def _origin(data: PreparedDataset) -> dict[str, Any]:
    return {"path": str(data.path), "sha256": data.manifest.get("sha256", {})}
