"""The ranker inside a bundle: ``BUNDLE/ranker/``, loaded without pickle.

    ranker/manifest.json   format, kind, the retriever version it was mined from, the
                           feature spec, training settings and metrics, sha256 of each file
    ranker/item_tables.npz popularity, known flags, metadata ids, year buckets (allow_pickle=False)
    ranker/mlp.pt | lgbm.txt  torch state_dict (weights_only=True) or LightGBM text model

The folder is written under a temporary name and renamed into place; a ranker mined
from another retriever version, or with a different feature list, is refused.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from ranker.features import DENSE_FEATURES, TABLES_FILE, FeatureBatch, ItemTables, feature_spec
from ranker.lgbm import LGBMRanker
from ranker.mlp import MLPRanker
from retriever.atomic import atomic_write, sha256_file
from retriever.errors import RetrieverError
from retriever.manifest import RetrieverManifest

FORMAT = "seqrec.ranker/1"
FOLDER = "ranker"
MANIFEST = "manifest.json"


class Ranker(Protocol):
    """What both rankers offer: score a feature batch, save into a folder."""

    kind: ClassVar[str]

    def score(self, batch: FeatureBatch) -> Tensor: ...  # (B, N), -inf on empty slots

    def save(self, folder: Path) -> dict[str, Any]: ...  # {"files": [...], "config": {...}}


RANKERS: dict[str, Any] = {"mlp": MLPRanker, "lgbm": LGBMRanker}


class RankerError(RetrieverError):
    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class RankerArtifact:
    path: Path
    manifest: dict[str, Any]
    ranker: Ranker
    tables: ItemTables

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])


def write_ranker(bundle: Path, ranker: Ranker, tables: ItemTables, *, retriever_manifest: RetrieverManifest,
                 metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write BUNDLE/ranker/ (replacing an existing one only once the new one is complete)."""
    tmp = bundle / f".{FOLDER}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        saved = ranker.save(tmp)
        tables.save(tmp / TABLES_FILE)
        files = [*saved["files"], TABLES_FILE]
        created = datetime.now(UTC)
        manifest = {
            "format": FORMAT,
            "kind": ranker.kind,
            "created_at": created.isoformat(timespec="seconds"),
            "retriever_version": retriever_manifest["version"],
            "features": feature_spec(tables, int(retriever_manifest["dim"])),
            "config": saved["config"],
            "metrics": dict(metrics or {}),
            **dict(extra or {}),
            "sha256": {name: sha256_file(tmp / name) for name in files},
        }
        atomic_write(tmp / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2)))
        final, old = bundle / FOLDER, bundle / f".{FOLDER}.{os.getpid()}.old"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def load_ranker(bundle: Path, retriever_manifest: RetrieverManifest) -> RankerArtifact | None:
    """The bundle's ranker, or None when it has none; refused on any mismatch."""
    folder = Path(bundle) / FOLDER
    if not folder.exists():
        return None
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise RankerError(folder / MANIFEST, f"unreadable: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RankerError(folder / MANIFEST, f"not a {FORMAT} manifest")
    if manifest.get("retriever_version") != retriever_manifest.get("version"):
        raise RankerError(folder, f"was mined from retriever {manifest.get('retriever_version')}, but the bundle "
                          f"holds {retriever_manifest.get('version')}; retrain it with `seqrec train-ranker`")
    spec = manifest.get("features", {})
    if spec.get("dense") != list(DENSE_FEATURES):
        raise RankerError(folder, "was trained on another feature list than this version of seqrec computes")
    for name, digest in dict(manifest.get("sha256", {})).items():
        file = folder / name
        if not file.is_file() or sha256_file(file) != digest:
            raise RankerError(file, "missing or its checksum does not match the manifest")
    kind = manifest.get("kind")
    if kind not in RANKERS:
        raise RankerError(folder / MANIFEST, f"unknown ranker kind {kind!r}")
    tables = ItemTables.load(folder / TABLES_FILE)
    if tables.n_items != retriever_manifest.get("n_items"):
        raise RankerError(folder / TABLES_FILE, f"describes {tables.n_items} items; the retriever has "
                          f"{retriever_manifest.get('n_items')}")
    try:
        ranker = RANKERS[kind].load(folder, manifest)
    except (RuntimeError, OSError, ValueError, KeyError, TypeError) as err:
        raise RankerError(folder, f"ranker weights do not load: {str(err).splitlines()[0]}") from None
    return RankerArtifact(folder, manifest, ranker, tables)


def unit_item_vectors(item_vectors: Tensor) -> Tensor:
    """(n_items + 1, D) unit vectors with row 0 (padding) = 0, as the features expect."""
    vectors = torch.nn.functional.normalize(item_vectors.float(), dim=-1)
    vectors[0] = 0.0
    return vectors
