"""Catalogue changes without retraining: items added (`POST /admin/items`) and retired (`DELETE /admin/items/{id}`).

The changes live in a journal beside the served bundle (``BUNDLE/catalogue_changes.json``, written atomically)
and are applied to the bundle as loaded from disk every time it is loaded (start, reload) and after every
change, so a restart or a reload serves exactly what was answered before it. A publish makes a new bundle
folder without a journal: the pipeline has taken the added items into its training data and carries the
retired ones over (`offline.jobs.catalog`).

* An added item of a model with item features (``model.item_features``, e.g. Beauty's ``attributes``) gets
  a vector at once: its ID part is zero and its feature part the mean of its known feature values' trained
  embeddings (`retriever.backbones.base.SequenceEncoder.add_items`); it joins the FAISS index (flat, HNSW
  or IVF: ``add``), the history encoder and the popularity fallback (last: it has no training count), and
  the ranker sees it as an unknown item (its ID-derived features zeroed, as in the ranker's training).
  An item none of whose feature values the model knows, or any item of a model without item features,
  is kept in the journal as *pending*: not served until the next training takes it in.
* A retired item is never recommended again (excluded from retrieval, hence from the ranker's candidates,
  and from the popularity fallback) but is still read in histories.
"""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import functools
import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow.parquet as pq
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.atomic import atomic_write, replace_dir
from ranker.artifact import unit_item_vectors
from ranker.tables import TorchTables
from retriever.artifact import CATALOGUE, item_matrix
from retriever.features import feature_rows, feature_vocabulary
from service.system.bundle import Bundle, BundleError
from service.system.loader import Inference, load_bundle

JOURNAL = "catalogue_changes.json"
LOCK = ".catalogue_changes.lock"
FORMAT = "seqrec.catalogue-changes/1"


class CatalogChanges(BaseModel):
    """The journal: items added (``item_id`` plus catalogue columns), in order, and ids retired."""

    model_config = ConfigDict(extra="allow")

    format: str = FORMAT
    added: list[dict[str, Any]] = Field(default_factory=list)
    retired: list[str] = Field(default_factory=list)

    @property
    def added_ids(self) -> list[str]:
        return [str(item["item_id"]) for item in self.added]


def read_journal(bundle_path: Path) -> CatalogChanges:
    """The bundle's journal; an empty one when there is none."""
    file = bundle_path / JOURNAL
    if not file.is_file():
        return CatalogChanges()
    try:
        return CatalogChanges.model_validate(json.loads(file.read_text()))
    except (OSError, ValueError, ValidationError) as err:
        raise BundleError(f"{file}: unreadable catalogue journal: {str(err).splitlines()[0]}") from None


def write_journal(bundle_path: Path, changes: CatalogChanges) -> None:
    text = json.dumps(changes.model_dump(mode="json"), indent=2) + "\n"
    atomic_write(bundle_path / JOURNAL, lambda p: p.write_text(text))


@contextmanager
def journal_lock(bundle_path: Path) -> Iterator[None]:
    """Hold ``BUNDLE/.catalogue_changes.lock`` (flock, waiting for it): one catalogue change at a time across the
    service's worker processes, each read from the journal on disk and written back whole. A lock file replaced
    while waiting (`seqrec export` swaps the whole folder) is opened again, so every holder locks the same file."""
    while True:
        with (bundle_path / LOCK).open("a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                current = os.stat(bundle_path / LOCK).st_ino
            except FileNotFoundError:
                continue
            if current != os.fstat(handle.fileno()).st_ino:
                continue
            yield
            return


def keeping_catalogue_changes(staging: Path, bundle_path: Path) -> None:
    """Replace ``bundle_path`` by its staged copy ``staging`` (`common.atomic.replace_dir`) under the journal
    lock, with the journal as it is then: a catalogue change a server made while the copy was built (an export's
    seconds) was lost, and a retired item recommended again."""
    with journal_lock(bundle_path):
        journal = bundle_path / JOURNAL
        if journal.exists():
            shutil.copyfile(journal, staging / JOURNAL)
        else:
            (staging / JOURNAL).unlink(missing_ok=True)
        replace_dir(staging, bundle_path)


def synced(bundle: Bundle) -> Bundle:
    """``bundle`` with the journal on disk applied when it differs from what ``bundle`` serves (another worker
    changed the catalogue), else ``bundle`` itself."""
    changes = read_journal(bundle.path)
    return bundle if changes == (bundle.changes or CatalogChanges()) else apply_changes(bundle, changes)


def load_served(path: Path, *, inference: Inference = "auto", threads: int = 1) -> Bundle:
    """`service.system.loader.load_bundle`, then the bundle's catalogue journal applied: what the service serves."""
    base = load_bundle(path, inference=inference, threads=threads)
    changes = read_journal(base.path)
    return apply_changes(base, changes) if changes.added or changes.retired else base


def apply_changes(base: Bundle, changes: CatalogChanges) -> Bundle:
    """``base`` (as loaded from disk, no change applied) with ``changes`` applied."""
    base = base.base or base
    vectorised, features = _vectorisable(base, changes.added)
    new_ids = [str(item["item_id"]) for item in vectorised]
    n_old, n_new = base.n_items, len(new_ids)
    artifact, vectors, tables = base.artifact, base.vectors, base.tables
    if n_new:
        model = copy.deepcopy(artifact.model)
        model.encoder.add_items(torch.from_numpy(features))
        with torch.inference_mode():
            vectors = unit_item_vectors(model.item_vectors().detach())
        assert artifact.index is not None  # load_bundle always loads it
        index = faiss.clone_index(artifact.index)
        index.add(item_matrix(model)[n_old:])  # the model's scoring vectors, as the index was built
        artifact = dataclasses.replace(artifact, model=model, index=index,
                                       item_ids=np.concatenate([artifact.item_ids, np.asarray(new_ids, dtype=str)]))
        tables = None if tables is None else extend_tables(tables, n_new)
    index_of = {**base.index_of, **{item: n_old + 1 + j for j, item in enumerate(new_ids)}}
    retired = frozenset(index_of[i] for i in changes.retired if i in index_of)
    popularity = np.concatenate([base.popularity, np.zeros(n_new)])
    order = np.concatenate([base.popular, np.arange(n_old + 1, n_old + 1 + n_new)])
    popular = order[~np.isin(order, np.fromiter(retired, dtype=np.int64, count=len(retired)))]
    metadata = [*base.metadata, *(_metadata(item) for item in vectorised)]
    # The compiled encoder embeds the trained item table: with added items the extended model runs eagerly.
    compiled = base.compiled_encoder if not n_new else None
    inference = {**base.inference, "encoder": "eager"} if n_new else base.inference
    return Bundle(base.path, artifact, base.ranker, tables, vectors, index_of, metadata, popular, popularity,
                  compiled_encoder=compiled, inference=dict(inference), retired=retired, changes=changes, base=base)


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
