"""Catalogue changes without retraining: items added (`POST /admin/items`) and retired (`DELETE /admin/items/{id}`).

The changes live in a journal beside the published versions (``ARTIFACTS/catalogue_changes.jsonl``; a bundle
served from another folder keeps it inside; format and place: `service.system.journal`), appended to, never
rewritten, and are applied to the bundle as loaded from disk every time it is loaded (start, reload, rollback)
and after every change, so a restart, a reload or a rollback to an older version serves exactly what was
answered before it. A publish needs no copy: the new version reads the same journal, and the items the pipeline
took into its training data (`offline.jobs.catalog`) are served as trained items, their journal rows skipped.

* An added item of a model with item features (``model.item_features``, e.g. Beauty's ``attributes``) gets
  a vector at once: its feature part is the mean of its known feature values' trained embeddings and its ID
  part ``model.added_id_weight`` times the mean ID row of the trained items sharing those values
  (`retriever.backbones.transformer.Transformer.borrowed_id_rows`; the weight is chosen on validation in
  docs/results/cold-calibration: with no ID part the new items crowded out the trained ones); it joins the
  FAISS index (flat, HNSW or IVF: ``add``), the history encoder and the popularity fallback (last: it has no
  training count), and the ranker sees it as an unknown item (its ID-derived features zeroed, as in the
  ranker's training).
  An item none of whose feature values the model knows, or any item of a model without item features,
  is kept in the journal as *pending*: not served until the next training takes it in.
* A retired item is never recommended again (excluded from retrieval, hence from the ranker's candidates,
  and from the popularity fallback) but is still read in histories.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import shutil
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow.parquet as pq
import torch
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from common.atomic import replace_dir
from ranker.artifact import unit_item_vectors
from ranker.tables import TorchTables
from retriever.artifact import CATALOGUE, item_matrix
from retriever.features import feature_rows, feature_vocabulary
from service.system.bundle import Bundle, BundleError
from service.system.journal import (
    JOURNAL,
    LEGACY_FORMAT,
    LEGACY_JOURNAL,
    JournalError,
    Position,
    Record,
    append_record,
    journal_file,
    journal_lock,
    read_records,
    read_since,
    write_records,
)
from service.system.loader import Inference, load_bundle

__all__ = ["JOURNAL", "LEGACY_JOURNAL", "journal_lock"]  # re-exported: callers import them from here

class CatalogChanges(BaseModel):
    """The journal's changes: items added (``item_id`` plus catalogue columns), in order, and ids retired.

    A served bundle's changes grow in place as changes are journalled (`extend`), with an id set beside the lists,
    so a change costs the same however many items the journal holds: the object always matches the bundle the
    engine serves (a change that fails leaves it as it was)."""

    model_config = ConfigDict(extra="allow")

    format: str = LEGACY_FORMAT
    added: list[dict[str, Any]] = Field(default_factory=list)
    retired: list[str] = Field(default_factory=list)
    _ids: set[str] | None = PrivateAttr(default=None)  # added and retired ids, built on first use
    _position: Position | None = PrivateAttr(default=None)  # how much of the journal file these are

    @property
    def added_ids(self) -> list[str]:
        return [str(item["item_id"]) for item in self.added]

    def _id_set(self) -> set[str]:
        if self._ids is None:
            self._ids = {*self.added_ids, *(f"\0{i}" for i in self.retired)}
        return self._ids

    def is_added(self, item_id: str) -> bool:
        return item_id in self._id_set()

    def is_retired(self, item_id: str) -> bool:
        return f"\0{item_id}" in self._id_set()

    def extend(self, records: list[Record], position: Position | None) -> None:
        """Take in journalled changes (after they are applied to the bundle that serves them)."""
        ids = self._id_set()
        for record in records:
            for row in record.get("added", []):
                self.added.append(row)
                ids.add(str(row["item_id"]))
            for item in map(str, record.get("retired", [])):
                if f"\0{item}" not in ids:
                    self.retired.append(item)
                    ids.add(f"\0{item}")
        self._position = position


def read_journal(bundle_path: Path) -> CatalogChanges:
    """The changes that apply to the bundle (`service.system.journal`); none when there is no journal."""
    try:
        records, position = read_records(bundle_path)
    except (OSError, JournalError) as err:
        raise BundleError(str(err) if isinstance(err, JournalError) else
                          f"{journal_file(bundle_path)}: unreadable catalogue journal: {err}") from None
    changes = CatalogChanges()
    changes.extend(records, position)
    return changes


def write_journal(bundle_path: Path, changes: CatalogChanges) -> None:
    """Replace the journal that applies to ``bundle_path`` with ``changes`` (one line of them)."""
    write_records(bundle_path, [{"added": changes.added, "retired": changes.retired}]
                  if changes.added or changes.retired else [])


def keeping_catalogue_changes(staging: Path, bundle_path: Path) -> None:
    """Replace ``bundle_path`` by its staged copy ``staging`` (`common.atomic.replace_dir`) under the journal
    lock, with the journal files it holds as they are then (a bundle outside ARTIFACTS/versions keeps its journal
    inside): a catalogue change a server made while the copy was built (an export's seconds) was lost, and a
    retired item recommended again."""
    with journal_lock(bundle_path):
        for name in (JOURNAL, LEGACY_JOURNAL):
            if (bundle_path / name).exists():
                shutil.copyfile(bundle_path / name, staging / name)
            else:
                (staging / name).unlink(missing_ok=True)
        replace_dir(staging, bundle_path)


def synced(bundle: Bundle) -> Bundle:
    """``bundle`` with what other workers journalled since it was loaded applied (only the lines after those it
    has read), else ``bundle`` itself."""
    changes: CatalogChanges = bundle.changes or CatalogChanges()
    since = None if changes._position is None else _read_since(bundle.path, changes._position)
    if since is None:  # never read, or the file was replaced: read it whole
        full = read_journal(bundle.path)
        if (full.added, full.retired, full._position) == (changes.added, changes.retired, changes._position):
            return bundle
        return apply_changes(bundle, full)
    records, position = since
    return apply_records(bundle, records, position) if records else bundle


def _read_since(bundle_path: Path, position: Position) -> tuple[list[Record], Position] | None:
    try:
        return read_since(bundle_path, position)
    except (OSError, JournalError) as err:
        raise BundleError(str(err)) from None


def commit(bundle: Bundle, record: Record) -> Bundle:
    """Journal one change (``{"added": rows}`` or ``{"retired": ids}``) and return ``bundle`` with it applied.
    Call it holding `journal_lock`, with ``bundle`` `synced`: nothing changes when the write fails (OSError)."""
    new = apply_records(bundle, [record], None, take=False)
    append_record(bundle.path, record)
    changes: CatalogChanges = new.changes
    inode_size = os.stat(journal_file(bundle.path))
    changes.extend([record], (inode_size.st_ino, inode_size.st_size))
    return new


def load_served(path: Path, *, inference: Inference = "auto", threads: int = 1) -> Bundle:
    """`service.system.loader.load_bundle`, then the bundle's catalogue journal applied: what the service serves."""
    base = load_bundle(path, inference=inference, threads=threads)
    return apply_changes(base, read_journal(base.path))


def apply_changes(base: Bundle, changes: CatalogChanges, *, id_weight: float | None = None) -> Bundle:
    """``base`` (as loaded from disk, no change applied) with ``changes`` applied; ``id_weight`` replaces the
    model's ``added_id_weight`` (the calibration bench tries several; the service never passes it)."""
    base = base.base or base
    if not (changes.added or changes.retired):
        return dataclasses.replace(base, changes=changes, base=None, pending_count=0)
    return _apply(base, base, changes.added, changes.retired, changes, id_weight)


def apply_records(bundle: Bundle, records: list[Record], position: Position | None, *, take: bool = True) -> Bundle:
    """``bundle`` (changes applied) with more changes applied on top: the cost of the new changes alone. With
    ``take``, the bundle's changes take them in (else the caller does, once they are journalled)."""
    changes: CatalogChanges = bundle.changes or CatalogChanges()
    added = [row for r in records for row in r.get("added", [])]
    retired = [str(i) for r in records for i in r.get("retired", [])]
    new = _apply(bundle.base or bundle, bundle, added, retired, changes)
    if take:
        changes.extend(records, position)
    return new


def _apply(base: Bundle, served: Bundle, added: list[dict[str, Any]], retired_ids: list[str],
           changes: CatalogChanges, id_weight: float | None = None) -> Bundle:
    """``served`` (``base`` with some changes applied, or ``base`` itself) with ``added`` and ``retired_ids``
    applied as well; items ``served`` already has are skipped (a later version trained them)."""
    fresh = [row for row in added if str(row["item_id"]) not in served.index_of]
    vectorised, features = _vectorisable(base, fresh)
    new_ids = [str(item["item_id"]) for item in vectorised]
    n_old, n_new = served.n_items, len(new_ids)
    artifact, vectors, tables = served.artifact, served.vectors, served.tables
    if n_new:
        model = copy.deepcopy(artifact.model)
        model.encoder.add_items(torch.from_numpy(features), added_id_rows(base, features, id_weight))
        with torch.inference_mode():
            vectors = unit_item_vectors(model.item_vectors().detach())
        assert artifact.index is not None  # load_bundle always loads it
        index = faiss.clone_index(artifact.index)
        index.add(item_matrix(model)[n_old:])  # the model's scoring vectors, as the index was built
        artifact = dataclasses.replace(artifact, model=model, index=index,
                                       item_ids=np.concatenate([artifact.item_ids, np.asarray(new_ids, dtype=str)]))
        tables = None if tables is None else extend_tables(tables, n_new)
    index_of = {**served.index_of, **{item: n_old + 1 + j for j, item in enumerate(new_ids)}}
    retired = served.retired | frozenset(index_of[i] for i in retired_ids if i in index_of)
    popularity = np.concatenate([served.popularity, np.zeros(n_new)])
    order = np.concatenate([served.popular, np.arange(n_old + 1, n_old + 1 + n_new)])
    popular = order[~np.isin(order, np.fromiter(retired, dtype=np.int64, count=len(retired)))]
    metadata = [*served.metadata, *(_metadata(item) for item in vectorised)]
    # The compiled encoder embeds the trained item table: with added items the extended model runs eagerly.
    compiled = served.compiled_encoder if not n_new else None
    inference = {**served.inference, "encoder": "eager"} if n_new else served.inference
    n_pending = served.pending_count + len(fresh) - n_new
    return Bundle(base.path, artifact, base.ranker, tables, vectors, index_of, metadata, popular, popularity,
                  compiled_encoder=compiled, inference=dict(inference), retired=retired, changes=changes, base=base,
                  pending_count=n_pending)


def added_id_rows(base: Bundle, features: np.ndarray, id_weight: float | None = None) -> torch.Tensor | None:
    """The ID part of new items with ``features``: the weight (``model.added_id_weight`` unless given) times the
    mean ID row of the trained items sharing their values, read from ``base``'s model (the trained one, so an
    item's vector does not depend on what was added before it); None for a weight of 0."""
    weight = base.artifact.config.model.added_id_weight if id_weight is None else id_weight
    if weight < 0:
        raise ValueError(f"the added items' ID weight must be >= 0, got {weight}")
    if weight == 0:
        return None
    with torch.no_grad():
        return weight * base.artifact.model.encoder.borrowed_id_rows(torch.from_numpy(features))


def pending(bundle: Bundle) -> list[str]:
    """Added ids the served model has no vector for (they wait for the next training)."""
    changes = bundle.changes
    return [] if changes is None else [i for i in changes.added_ids if i not in bundle.index_of]


def feature_column(bundle: Bundle) -> str | None:
    return bundle.artifact.config.model.item_features


def _vectorisable(base: Bundle, added: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The added items the model can give a vector (at least one known feature value) and their feature ids."""
    column = feature_column(base)
    encoder = base.artifact.model.encoder
    width = int(getattr(encoder, "item_features", torch.zeros(0, 1)).shape[1])
    if column is None or not added:
        return [], np.zeros((0, width), dtype=np.int64)
    vocabulary = catalogue_vocabulary(base, column)
    rows = feature_rows([item.get(column) for item in added], vocabulary, width)
    keep = (rows != 0).any(axis=1)
    return [item for item, k in zip(added, keep, strict=True) if k], rows[keep]


def catalogue_vocabulary(bundle: Bundle, column: str) -> dict[str, int]:
    """The feature ids the model was trained with: numbered from the bundle's own catalogue, as training did."""
    return _vocabulary(bundle.path / CATALOGUE, column, bundle.version)


@functools.lru_cache(maxsize=4)
def _vocabulary(file: Path, column: str, version: str) -> dict[str, int]:
    try:
        values = pq.read_table(file, columns=[column]).column(column).to_pylist()
    except (OSError, ValueError, KeyError) as err:
        raise BundleError(f"{file}: cannot read the {column!r} column the model's item features come from: "
                          f"{err}") from None
    return feature_vocabulary(values)


def extend_tables(tables: TorchTables, n_new: int) -> TorchTables:
    """The ranker's per-item tables with ``n_new`` rows for new items: unknown (never in training), no
    popularity, no metadata ids (the ranker's own vocabulary is not in the bundle), nothing followed."""
    n_old = tables.popularity.shape[0]  # n_items + 1
    pairs_a, pairs_b = tables.pair_keys // n_old, tables.pair_keys % n_old
    return dataclasses.replace(
        tables,
        popularity=torch.cat([tables.popularity, tables.popularity.new_zeros(n_new)]),
        known=torch.cat([tables.known, tables.known.new_zeros(n_new)]),
        meta=torch.cat([tables.meta, tables.meta.new_zeros(n_new, tables.meta.shape[1])]),
        year_bucket=torch.cat([tables.year_bucket, tables.year_bucket.new_zeros(n_new)]),
        pair_keys=pairs_a * (n_old + n_new) + pairs_b,  # keys are a * (n_items + 1) + b
        follow_totals=torch.cat([tables.follow_totals, tables.follow_totals.new_zeros(n_new)]),
    )


def _metadata(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column, value in item.items():
        if column == "item_id" or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        out[column] = [str(v) for v in value] if isinstance(value, list) else value
    return out
