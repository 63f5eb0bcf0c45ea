"""Raw interactions -> the prepared folder: stable time sort, filters, id maps, checksums.

Ordering rule (the most common silent bug in sequential recommendation): each user's
interactions are sorted by timestamp with a stable sort, so interactions with equal
timestamps keep the order of the source file. Never a tie-break by item id.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.atomic import replace_dir, staging_dir
from common.errors import SeqrecError
from common.folders import check_replaceable
from offline.data.prepared import FORMAT, ITEMS, MANIFEST, SEQUENCES, USERS, read_manifest, sha256_file
from offline.data.readers.base import RawDataset, natural_key
from offline.data.sequences import Sequences
from offline.data.split import MIN_LENGTH, leave_one_out, repeat_shares

MAX_ID_CHARS = 256  # the longest user or item id a request to the service may carry (service/http/schemas.py)

log = logging.getLogger(__name__)
# (time-ordered sequences, whether they have timestamps) -> a record for the manifest, or a refusal
SplitCheck = Callable[[Sequences, bool], dict[str, Any]]


@dataclass(frozen=True)
class Filters:
    """min_user_interactions: drop users with fewer (>= 3 so every user has a training,
    a validation and a test item). k_core: repeatedly drop users and items with fewer
    than k interactions until none is left. min_rating: drop interactions rated below."""

    min_user_interactions: int = MIN_LENGTH
    k_core: int | None = None
    min_rating: float | None = None

    def __post_init__(self) -> None:
        if self.min_user_interactions < MIN_LENGTH:
            raise SeqrecError(
                f"--min-user-interactions must be >= {MIN_LENGTH}: leave-one-out needs a training, "
                "a validation and a test item per user"
            )
        if self.k_core is not None and self.k_core < 1:
            raise SeqrecError("--k-core must be >= 1")


@dataclass(frozen=True)
class Encoded:
    """Interactions as int codes in time order per user, after filtering."""

    users: np.ndarray  # (n,) user code, sorted
    items: np.ndarray  # (n,) item code
    times: np.ndarray  # (n,)
    user_names: np.ndarray  # code -> external id
    item_names: np.ndarray


def prepare(
    raw: RawDataset, out: str | Path, filters: Filters | None = None, *, overwrite: bool = False,
    extra: dict[str, Any] | None = None, check_split: SplitCheck | None = None,
) -> dict[str, Any]:
    """Write the prepared folder for ``raw`` to ``out`` atomically; return its manifest.

    check_split: called with the time-ordered sequences and whether they have timestamps before anything is
    written (`--protocol temporal` refuses data it cannot cut there); what it returns goes into the manifest."""
    filters = filters or Filters()
    out = Path(out)
    if out.exists() and not overwrite:
        raise SeqrecError(f"{out} already exists; pass --overwrite to replace it")
    check_replaceable(out, _is_prepared, "a prepared dataset")
    table = _apply_rating_filter(raw, filters.min_rating)
    encoded = _encode_sorted(table)
    encoded = _filter(encoded, filters)
    if len(encoded.users) == 0:
        raise SeqrecError(f"no interactions left after filtering ({asdict(filters)})")
    sequences, items, users = _tables(encoded, raw)
    manifest = {
        "format": FORMAT,
        "source": raw.source,
        "users": sequences.num_rows,
        "items": items.num_rows,
        "interactions": len(encoded.items),
        "has_timestamps": raw.has_timestamps,
        "repeat_targets": _repeat_shares(encoded),
        "filters": asdict(filters),
        "item_columns": [c for c in items.column_names if c not in ("item_idx", "item_id")],
        "source_files": {p.name: sha256_file(p) for p in raw.files},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    if check_split is not None:
        manifest["split"] = check_split(_sequences(encoded), raw.has_timestamps)
    _write_atomically(out, {SEQUENCES: sequences, ITEMS: items, USERS: users}, manifest)
    return manifest


def _sequences(data: Encoded) -> Sequences:
    """The encoded interactions as CSR sequences (item codes + 1: internal ids), with their times."""
    _, starts = np.unique(data.users, return_index=True)
    offsets = np.append(starts, len(data.users)).astype(np.int64)
    return Sequences(offsets, data.items.astype(np.int64) + 1, np.asarray(data.times))


def _repeat_shares(data: Encoded) -> dict[str, float]:
    """Share of validation and test targets that repeat an item earlier in the user's sequence
    (what decides `train.repeats: auto`; see retriever/repeats.py)."""
    _, starts = np.unique(data.users, return_index=True)
    offsets = np.append(starts, len(data.users)).astype(np.int64)
    return repeat_shares(leave_one_out(Sequences(offsets, data.items.astype(np.int64))))


def _apply_rating_filter(raw: RawDataset, min_rating: float | None) -> pa.Table:
    table = raw.interactions
    if min_rating is None:
        return table
    if "rating" not in table.column_names:
        raise SeqrecError(f"--min-rating given but the {raw.source} data has no ratings")
    kept = table.filter(pc.greater_equal(table.column("rating"), min_rating))
    log.info("--min-rating %g kept %d of %d interactions", min_rating, kept.num_rows, table.num_rows)
    return kept


def _encode_sorted(table: pa.Table) -> Encoded:
    user_codes, user_names = _codes(table.column("user_id"))
    item_codes, item_names = _codes(table.column("item_id"))
    _check_id_lengths("user", user_names)
    _check_id_lengths("item", item_names)
    times = table.column("timestamp").to_numpy()
    # Users in natural id order; within a user, time order; ties keep the file's row order
    # (the row index is the last key, so the result does not depend on sort stability).
    rank_of_code = _rank_by_natural_key(user_names)
    user_rank = rank_of_code[user_codes]
    order = np.lexsort((np.arange(len(times)), times, user_rank))
    names_by_rank = np.empty_like(user_names)
    names_by_rank[rank_of_code] = user_names
    return Encoded(user_rank[order], item_codes[order], times[order], names_by_rank, item_names)


def _check_id_lengths(what: str, names: np.ndarray) -> None:
    """Ids longer than a request may carry (`service.http.schemas`) would be trained on and evaluated, yet never served:
    every request naming one is a 422."""
    long = [str(name) for name in names if len(str(name)) > MAX_ID_CHARS]
    if long:
        raise SeqrecError(f"{len(long):,} {what} id(s) longer than {MAX_ID_CHARS} characters, the longest a request "
                          f"to the service may carry, e.g. {long[0][:40]!r}... ({len(long[0]):,} characters); "
                          f"shorten or map them (a hash) before preparing")


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    encoded = column.combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy().astype(np.int64)
    return codes, encoded.dictionary.to_numpy(zero_copy_only=False).astype(object)


def _rank_by_natural_key(names: np.ndarray) -> np.ndarray:
    order = sorted(range(len(names)), key=lambda i: natural_key(str(names[i])))
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(names))
    return rank


def _filter(data: Encoded, filters: Filters) -> Encoded:
    keep = np.ones(len(data.users), dtype=bool)
    k = filters.k_core
    while True:
        user_counts = np.bincount(data.users[keep], minlength=len(data.user_names))
        drop = user_counts[data.users] < max(filters.min_user_interactions, k or 0)
        if k:
            item_counts = np.bincount(data.items[keep], minlength=len(data.item_names))
            drop |= item_counts[data.items] < k
        drop &= keep
        if not drop.any():
            break
        keep &= ~drop
    log.info("filters kept %d of %d interactions", int(keep.sum()), len(keep))
    return Encoded(data.users[keep], data.items[keep], data.times[keep], data.user_names, data.item_names)


def _tables(data: Encoded, raw: RawDataset) -> tuple[pa.Table, pa.Table, pa.Table | None]:
    user_codes, user_starts = np.unique(data.users, return_index=True)
    item_codes = np.unique(data.items)
    item_codes = item_codes[np.argsort(_rank_by_natural_key(data.item_names[item_codes]))]
    item_ids = data.item_names[item_codes]
    offsets = np.append(user_starts, len(data.users)).astype(np.int32 if len(data.users) < 2**31 else np.int64)
    flat_items = pa.array(data.item_names, pa.string()).take(pa.array(data.items))  # no per-row Python objects
    items_lists = _lists(offsets, flat_items)
    user_ids = pa.array(data.user_names[user_codes], pa.string())
    sequences = pa.table(
        {
            "user_idx": pa.array(np.arange(len(user_codes), dtype=np.int64)),
            "user_id": user_ids,
            "items": items_lists,
            "timestamps": _lists(offsets, pa.array(data.times)),
        }
    )
    items = _with_metadata(
        pa.table({"item_idx": pa.array(np.arange(1, len(item_ids) + 1, dtype=np.int64)),
                  "item_id": pa.array(item_ids, pa.string())}),
        raw.items, "item_id", raw.source,
    )
    users = None
    if raw.users is not None:
        users = _with_metadata(sequences.select(["user_idx", "user_id"]), raw.users, "user_id", raw.source)
    return sequences, items, users


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    array_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    return array_type.from_arrays(pa.array(offsets), values)


def _with_metadata(keys: pa.Table, metadata: pa.Table | None, key: str, source: str) -> pa.Table:
    if metadata is None:
        return keys
    clash = [name for name in metadata.column_names if name != key and name in keys.column_names]
    if clash:
        raise SeqrecError(f"the {source} metadata has a column {clash[0]!r}, a name the prepared folder keeps for "
                          f"its own ({', '.join(keys.column_names)}); rename it")
    meta_keys = metadata.column(key).cast(pa.string())
    counts = pc.value_counts(meta_keys)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        first = repeated[0]["values"].as_py()
        raise SeqrecError(f"the {source} metadata lists {key} {first!r} more than once ({len(repeated)} such ids)")
    rows = pc.index_in(keys.column(key), value_set=meta_keys)
    missing = rows.null_count
    if missing:  # the metadata file lacks ids the interactions use: their columns stay empty
        first = keys.column(key).filter(pc.is_null(rows))[0].as_py()
        log.warning("the %s metadata has no row for %d of %d %ss (e.g. %r); their metadata columns are empty",
                    source, missing, keys.num_rows, key.removesuffix("_id"), first)
    joined = metadata.drop_columns([key]).take(rows)
    for name in joined.column_names:
        keys = keys.append_column(name, joined.column(name))
    return keys


def _is_prepared(folder: Path) -> bool:
    try:
        read_manifest(folder)
    except SeqrecError:
        return False
    return True


def _write_atomically(out: Path, tables: dict[str, pa.Table | None], manifest: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging = staging_dir(out)
    except OSError as err:  # name the folder the user asked for, not our hidden sibling of it
        raise OSError(err.errno, err.strerror, str(out)) from None
    try:
        checksums = {}
        for name, table in tables.items():
            if table is not None:
                pq.write_table(table, staging / name)
                checksums[name] = sha256_file(staging / name)
        manifest = {**manifest, "sha256": checksums}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def prepare_dataset(dataset: str, out: str | Path, options: Any, filters: Filters | None = None, *,
                    download: bool = False, cache_dir: Path | None = None, overwrite: bool = False,
                    check_split: SplitCheck | None = None) -> dict[str, Any]:
    """`seqrec prepare` as a function: read ``dataset`` (``options``: a ``ReaderOptions``; with
    ``download``, fetch MovieLens from GroupLens into ``cache_dir`` or $SEQREC_CACHE first), then
    ``prepare`` it into ``out``."""
    from dataclasses import replace

    from offline.data.readers import MOVIELENS, read_dataset

    if download:
        if dataset not in MOVIELENS:
            raise SeqrecError(f"--download works for {', '.join(MOVIELENS)}, not {dataset}")
        from offline.data.readers.download import download_movielens

        cache = cache_dir or Path(os.environ.get("SEQREC_CACHE", Path.home() / ".cache" / "seqrec"))
        options = replace(options, path=download_movielens(dataset, cache))
    if options.synthetic and dataset != "synthetic":
        raise SeqrecError("--n-users/--n-items/--mean-length/--seed apply to --dataset synthetic only")
    log.info("reading %s from %s", dataset, options.path or "built-in generator")
    raw = read_dataset(dataset, options)
    extra = {"dataset": dataset, "synthetic_config": options.synthetic} if dataset == "synthetic" else None
    return prepare(raw, out, filters, overwrite=overwrite, extra=extra, check_split=check_split)
