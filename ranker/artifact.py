"""The ranker inside a bundle: ``BUNDLE/ranker/``, loaded without pickle.

    ranker/manifest.json   format, kind, the retriever version it was mined from, the
                           feature spec, training settings and metrics, sha256 of each file
    ranker/item_tables.npz popularity, known flags, metadata ids, year buckets (allow_pickle=False)
    ranker/mlp.pt | lgbm.txt  torch state_dict (weights_only=True) or LightGBM text model
    ranker/mlp.onnx        the MLP ranker compiled for ONNX Runtime (`ranker.compiled`), when it exports
    ranker/cooc.npz        the co-occurrence table (`ranker.cooc`), when the ranker's candidate
                           sources or extra features use it; the manifest's "sources" names the
                           sources merged into the candidate list (absent: the retriever alone)
    ranker/times.npz       the training interactions' times (`ranker.times`), when the ranker reads the
                           request-time features

The folder is written under a temporary name and renamed into place; a ranker mined
from another retriever version, or with a different feature list, is refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import Tensor

from common.atomic import atomic_write, replace_dir, sha256_file
from common.errors import first_line, validation_message
from common.folders import register_folder_kind
from ranker.compiled import MLP_FILE, CompiledMLP, write_mlp
from ranker.cooc import CoocTable
from ranker.features import FeatureBatch, feature_spec
from ranker.groups import Extras, base_columns, optional_columns, requiring, table_kind, tables_for
from ranker.lgbm import LGBMRanker
from ranker.mlp import MLPRanker
from ranker.tables import TABLES_FILE, ItemTables
from retriever.artifact import ArtifactError
from retriever.manifest import RetrieverManifest

FORMAT = "seqrec.ranker/1"
register_folder_kind("seqrec.ranker", "a ranker, the ranker/ folder of a bundle")
FOLDER = "ranker"
MANIFEST = "manifest.json"
log = logging.getLogger(__name__)


class _Table(Protocol):
    @property
    def n_items(self) -> int: ...


T = TypeVar("T", bound=_Table)


class Ranker(Protocol):
    """What both rankers offer: score a feature batch, save into a folder, load from one."""

    kind: ClassVar[str]

    def score(self, batch: FeatureBatch) -> Tensor: ...  # (B, N), -inf on empty slots

    def save(self, folder: Path) -> dict[str, Any]: ...  # {"files": [...], "config": {...}}


RANKERS: dict[str, type[MLPRanker] | type[LGBMRanker]] = {"mlp": MLPRanker, "lgbm": LGBMRanker}


class RankerManifest(BaseModel):
    """BUNDLE/ranker/manifest.json. Every field but ``format`` has a default so that a manifest
    missing one is refused by `load_ranker` with its own message (feature list, checksum, kind),
    as before the manifest was typed; fields beyond these (a newer writer's) are kept.
    Read it by attribute; ``to_json_dict()`` gives the JSON it was written as (same keys, same order).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    format: str
    kind: str | None = None
    created_at: str | None = None
    retriever_version: str | None = None
    features: dict[str, Any] = {}
    config: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    mining: dict[str, Any] | None = None  # train_ranker's record of the mined groups
    selection: dict[str, Any] | None = None  # the kinds compared and the one kept
    training: dict[str, Any] | None = None  # seconds and the training curve
    dataset: dict[str, Any] | None = None  # the prepared dataset's path and checksums
    sources: dict[str, Any] | None = None  # {"names": [...], "cooc_share": s}; None: the retriever alone
    sha256: dict[str, str] = {}

    def to_json_dict(self) -> dict[str, Any]:
        """The manifest as written: only the keys it was given, in the order the writer uses."""
        return self.model_dump(exclude_unset=True)


@dataclass(frozen=True)
class RankerArtifact:
    path: Path
    manifest: RankerManifest
    ranker: Ranker
    tables: ItemTables
    saved_tables: Mapping[str, Any] = field(default_factory=dict)  # `ranker.groups.TableKind` name -> table

    @property
    def cooc(self) -> CoocTable | None:
        """The co-occurrence table (the cooc source's and the cooc features'), None when neither is used."""
        return self.saved_tables.get("cooc")

    @property
    def kind(self) -> str:
        return str(self.manifest.kind)

    @property
    def extra_features(self) -> tuple[str, ...]:
        """The optional columns (`ranker.groups`) the ranker reads after the base features (none for older rankers)."""
        return tuple(_extras(self.manifest))

    @property
    def cooc_share(self) -> float | None:
        """The co-occurrence source's share of the candidate slots; None when the retriever alone retrieves."""
        sources = self.manifest.sources or {}
        return float(sources.get("cooc_share", 0.0)) if "cooc" in sources.get("names", ()) else None

    @cached_property
    def extras(self) -> Extras | None:
        """The extra feature columns' inputs (built once per loaded ranker; None without extras)."""
        if not self.extra_features:
            return None
        # load_ranker refuses a ranker whose extras lack their table
        return Extras(self.extra_features, {name: table_kind(name).runtime(self.saved_tables[name])
                                            for name in tables_for(self.extra_features)})

    @property
    def needs_time(self) -> bool:
        """Whether the ranker scores a request as of its time (a feature group requiring timestamps)."""
        return bool(requiring(self.extra_features, "timestamps"))

    @property
    def depth(self) -> int:
        """The retriever depth the ranker was trained to rerank (its manifest's mining record)."""
        mining = self.manifest.mining
        if mining is None or "depth" not in mining:
            raise ArtifactError(self.path / MANIFEST, "records no mining depth; retrain it with `seqrec train-ranker`")
        return int(mining["depth"])


def write_ranker(bundle: Path, ranker: Ranker, tables: ItemTables, *, retriever_manifest: RetrieverManifest,
                 metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                 saved_tables: Mapping[str, Any] | None = None, extra_features: tuple[str, ...] = ()) -> RankerManifest:
    """Write BUNDLE/ranker/ (replacing an existing one only once the new one is complete).

    saved_tables: the tables by `ranker.groups.TableKind` name (co-occurrence, request times), each saved as its
    kind's file (the sources and extra features that need them are the caller's ``extra["sources"]`` and
    ``extra_features``)."""
    tmp = bundle / f".{FOLDER}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        saved = ranker.save(tmp)
        tables.save(tmp / TABLES_FILE)
        files = [*saved["files"], TABLES_FILE, *_write_compiled(tmp, ranker)]
        for name, table in (saved_tables or {}).items():
            file = table_kind(name).file
            table.save(tmp / file)
            files.append(file)
        manifest = RankerManifest(
            format=FORMAT, kind=ranker.kind, created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            retriever_version=retriever_manifest.version,
            features=feature_spec(tables, retriever_manifest.dim, extra_features), config=saved["config"],
            metrics=dict(metrics or {}), **dict(extra or {}),
            sha256={name: sha256_file(tmp / name) for name in files},
        )
        text = json.dumps(manifest.to_json_dict(), indent=2)
        atomic_write(tmp / MANIFEST, lambda p: p.write_text(text))
        replace_dir(tmp, bundle / FOLDER)  # a server reloading the bundle meets the old ranker or the new one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _write_compiled(folder: Path, ranker: Ranker) -> list[str]:
    """mlp.onnx beside an MLP ranker's weights when it compiles (`ranker.compiled`); the files written."""
    eager = ranker.eager if isinstance(ranker, CompiledMLP) else ranker
    if not isinstance(eager, MLPRanker):
        return []
    reason = write_mlp(folder, eager)
    if reason is not None:
        log.info("the MLP ranker stays eager: %s", reason)
        return []
    return [MLP_FILE]


def read_manifest(folder: Path) -> RankerManifest:
    """FOLDER/manifest.json, refused when unreadable or not a ranker manifest of this format."""
    path = folder / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ArtifactError(path, f"unreadable: {err}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ArtifactError(path, f"not a {FORMAT} manifest")
    try:
        return RankerManifest.model_validate(raw)
    except ValidationError as err:
        raise ArtifactError(path, validation_message(err)) from None


def load_ranker(bundle: Path, retriever_manifest: RetrieverManifest) -> RankerArtifact | None:
    """The bundle's ranker, or None when it has none; refused on any mismatch."""
    folder = Path(bundle) / FOLDER
    if not folder.exists():
        return None
    manifest = read_manifest(folder)
    _check_lineage(folder, manifest, retriever_manifest)
    kind = manifest.kind
    if kind not in RANKERS:
        raise ArtifactError(folder / MANIFEST, f"unknown ranker kind {kind!r}")
    tables = ItemTables.load(folder / TABLES_FILE)
    if tables.n_items != retriever_manifest.n_items:
        raise ArtifactError(folder / TABLES_FILE, f"describes {tables.n_items} items; the retriever has "
                            f"{retriever_manifest.n_items}")
    try:
        ranker = RANKERS[kind].load(folder, manifest.config)
    except (RuntimeError, OSError, ValueError, KeyError, TypeError) as err:
        raise ArtifactError(folder, f"ranker weights do not load: {first_line(err)}") from None
    return RankerArtifact(folder, manifest, ranker, tables, _load_tables(folder, manifest, tables.n_items))


def _extras(manifest: RankerManifest) -> list[str]:
    return list(manifest.features.get("dense", [])[len(base_columns()):])


def _load_tables(folder: Path, manifest: RankerManifest, n_items: int) -> dict[str, Any]:
    """The tables the ranker's feature groups read, and the co-occurrence table when its sources use it (refused
    when missing)."""
    needed = {name: "reads features that need it" for name in tables_for(_extras(manifest))}
    if "cooc" in (manifest.sources or {}).get("names", ()):
        needed["cooc"] = "uses the co-occurrence source"
    return {name: _load_table(folder, manifest, n_items, table_kind(name).file, table_kind(name).load, why)
            for name, why in needed.items()}


def _load_table(folder: Path, manifest: RankerManifest, n_items: int, name: str, load: Callable[[Path], T],
                needed_by: str) -> T:
    """FOLDER/name through ``load``, refused when the manifest does not list it, when it does not load or when
    it describes another number of items than the ranker."""
    if name not in manifest.sha256:
        raise ArtifactError(folder / MANIFEST, f"{needed_by} but lists no {name}")
    try:
        table = load(folder / name)
    except (OSError, ValueError, KeyError) as err:
        raise ArtifactError(folder / name, f"unreadable: {err}") from None
    if table.n_items != n_items:
        raise ArtifactError(folder / name, f"describes {table.n_items} items; the ranker has {n_items}")
    return table


def _check_lineage(folder: Path, manifest: RankerManifest, retriever_manifest: RetrieverManifest) -> None:
    """Mined from this retriever, on this feature list, and every file as it was written."""
    if manifest.retriever_version != retriever_manifest.version:
        raise ArtifactError(folder, f"was mined from retriever {manifest.retriever_version}, but the bundle "
                            f"holds {retriever_manifest.version}; retrain it with `seqrec train-ranker`")
    dense = manifest.features.get("dense")
    base = list(base_columns())
    if not isinstance(dense, list) or dense[: len(base)] != base:
        raise ArtifactError(folder, "was trained on another feature list than this version of seqrec computes")
    unknown = [name for name in dense[len(base):] if name not in optional_columns()]
    if unknown:
        raise ArtifactError(folder, f"reads features {unknown} that no feature group of this version of seqrec "
                            "computes (`ranker.groups`)")
    for name, digest in manifest.sha256.items():
        file = folder / name
        if not file.is_file() or sha256_file(file) != digest:
            raise ArtifactError(file, "missing or its checksum does not match the manifest")


def unit_item_vectors(item_vectors: Tensor) -> Tensor:
    """(n_items + 1, D) unit vectors with row 0 (padding) = 0, as the features expect."""
    vectors = torch.nn.functional.normalize(item_vectors.float(), dim=-1)
    vectors[0] = 0.0
    return vectors
