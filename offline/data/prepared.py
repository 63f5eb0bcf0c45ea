"""The prepared dataset folder: the one format everything downstream reads.

    DIR/manifest.json       source, counts, filters, sha256 of every file below
    DIR/sequences.parquet   user_idx, user_id, items (list<string>, time order), timestamps
    DIR/items.parquet       item_idx (1..n_items), item_id, metadata columns
    DIR/users.parquet       user_idx, user_id, metadata columns (when the source has them)

Internal ids are the ``*_idx`` columns: items 1..n_items (0 is padding), users 0..n-1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.folders import register_folder_kind, wrong_manifest
from offline.data.errors import DataError
from offline.data.sequences import Sequences
from offline.data.split import LeaveOneOut, leave_one_out, repeat_shares

FORMAT = "seqrec.prepared/1"
register_folder_kind("seqrec.prepared", "a prepared dataset written by `seqrec prepare`",
                     replaced_by="`seqrec prepare --overwrite`")
MANIFEST = "manifest.json"
SEQUENCES = "sequences.parquet"
ITEMS = "items.parquet"
USERS = "users.parquet"


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class PreparedDataset:
    """A loaded prepared folder. ``item_ids[i]`` is the external id of internal item i
    (``item_ids[0]`` is the padding placeholder ""); ``user_ids[u]`` that of user row u."""

    path: Path
    manifest: dict[str, Any]
    sequences: Sequences
    user_ids: np.ndarray
    item_ids: np.ndarray
    items: pa.Table
    users: pa.Table | None

    @property
    def n_items(self) -> int:
        return len(self.item_ids) - 1

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    def split(self) -> LeaveOneOut:
        return leave_one_out(self.sequences)

    @property
    def repeat_shares(self) -> dict[str, float]:
        """Share of validation and test targets already in the user's history (the manifest's
        ``repeat_targets``; computed for folders prepared before it was recorded)."""
        stored = self.manifest.get("repeat_targets")
        return dict(stored) if isinstance(stored, dict) else repeat_shares(self.split())


def dataset_fingerprint(data: PreparedDataset) -> dict[str, Any]:
    """What names the data a model was trained or searched on: the artifact's ``dataset`` and a search's identity."""
    return {
        "path": str(data.path),
        "source": data.manifest.get("source"),
        "sha256": data.manifest.get("sha256", {}),
        "users": data.n_users,
        "items": data.n_items,
    }


def load_prepared(path: str | Path, *, verify: bool = True) -> PreparedDataset:
    """Load a folder written by `seqrec prepare`, checking its checksums first."""
    path = Path(path)
    manifest = read_manifest(path)
    if verify:
        verify_checksums(path, manifest)
    items = pq.read_table(path / ITEMS)
    item_idx = items.column("item_idx").to_numpy()
    if not np.array_equal(item_idx, np.arange(1, len(item_idx) + 1)):
        raise DataError(path / ITEMS, "item_idx must run 1..n_items in order")
    item_ids = np.concatenate([[""], items.column("item_id").to_numpy(zero_copy_only=False)]).astype(object)

    table = pq.read_table(path / SEQUENCES)
    lists = table.column("items").combine_chunks()
    internal = pc.index_in(lists.flatten(), value_set=items.column("item_id"))
    if internal.null_count:
        raise DataError(path / SEQUENCES, "holds item ids missing from items.parquet")
    offsets = lists.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    timestamps = None
    if "timestamps" in table.column_names:
        timestamps = table.column("timestamps").combine_chunks().flatten().to_numpy()
    sequences = Sequences(offsets, internal.to_numpy().astype(np.int64) + 1, timestamps)
    users = pq.read_table(path / USERS) if (path / USERS).exists() else None
    user_ids = table.column("user_id").to_numpy(zero_copy_only=False).astype(object)
    return PreparedDataset(path, manifest, sequences, user_ids, item_ids, items, users)


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise DataError(path, "no such prepared dataset folder (make one with `seqrec prepare`)")
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise DataError(manifest_path, "missing; is this a folder written by `seqrec prepare`?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(manifest_path, f"not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(manifest_path, wrong_manifest(FORMAT, manifest))
    return manifest


def verify_checksums(path: Path, manifest: dict[str, Any]) -> None:
    for name, expected in manifest.get("sha256", {}).items():
        file = path / name
        if not file.is_file():
            raise DataError(file, "listed in the manifest but missing")
        if sha256_file(file) != expected:
            raise DataError(file, "checksum does not match the manifest (file changed or corrupt)")
