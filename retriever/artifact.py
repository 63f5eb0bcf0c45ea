"""The retriever artifact: a folder that describes itself and loads without pickle.

    manifest.json   format, version, created_at, git sha, dataset fingerprint, backbone,
                    dim, n_items, metrics, index spec, sha256 of every file below
    config.json     the resolved run config (the model is rebuilt from it alone)
    retriever.pt    state_dict, loaded with torch.load(weights_only=True)
    item_ids.npy    index row r -> external id of internal item r + 1 (unicode, no pickle)
    items.faiss     L2-normalised item vectors (row r = internal item r + 1)
    encoder.onnx    the served user encoder compiled for ONNX Runtime (retriever.compiled), when the
                    backbone exports; the manifest's ``compiled`` says why not otherwise
    history.jsonl   per-epoch training log (loss, lr, validation metrics, speed)
    catalogue.parquet  the prepared items table (external id, title, genres/attributes, ...), optional
    popularity.npy  (n_items + 1,) int64 training-position counts (the service's cold-start order), optional

Files are written to temporary names and renamed; the manifest goes last, so a folder
whose manifest is present and whose checksums match is complete.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from common import seqrec_version
from common.atomic import atomic_torch_save, atomic_write, replace_dir, sha256_file, write_jsonl
from common.errors import RetrieverError, first_line, validation_message
from common.folders import wrong_manifest
from retriever.compiled import ENCODER_FILE, OPSET, write_encoder
from retriever.config import RunConfig, config_from_dict
from retriever.index import IndexSpec, build_index, load_index, normalize, save_index
from retriever.manifest import FORMAT, RetrieverManifest
from retriever.model import Retriever

__all__ = ["FORMAT", "ArtifactError", "RetrieverArtifact", "RetrieverManifest", "load_artifact", "read_manifest",
           "write_artifact"]
MANIFEST, CONFIG, WEIGHTS, ITEM_IDS, INDEX, HISTORY = (
    "manifest.json", "config.json", "retriever.pt", "item_ids.npy", "items.faiss", "history.jsonl",
)
CATALOGUE, POPULARITY = "catalogue.parquet", "popularity.npy"
log = logging.getLogger(__name__)


class ArtifactError(RetrieverError):
    """A bundle that must not be served: missing files, checksum or shape mismatch."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class RetrieverArtifact:
    path: Path
    manifest: RetrieverManifest
    config: RunConfig
    model: Retriever
    item_ids: np.ndarray  # (n_items,) external ids; row r = internal id r + 1
    index: Any | None  # faiss.Index, when loaded

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @functools.cached_property
    def max_len(self) -> int:  # cached: it builds the backbone's config, and every served request asks
        return self.config.max_len(self.n_items)


def item_matrix(model: Retriever) -> np.ndarray:
    """(n_items, D) float32 vectors of internal items 1..n_items, as the index holds them: the model's scoring
    vectors, unit for cosine and raw for dot (an index of unit vectors would rank a dot-product model by
    cosine, which is not what it was trained and evaluated on)."""
    with torch.inference_mode():
        vectors = model.item_vectors()[1:].detach().float().cpu().numpy()
    return normalize(vectors) if model.similarity == "cosine" else np.ascontiguousarray(vectors)


def retrieval_rows(model: Retriever, unit: torch.Tensor) -> np.ndarray:
    """(n_items + 1, D) float32 rows that retrieval scores are read from, row 0 = 0: ``unit`` (the model's unit item
    vectors) for a cosine model, the raw scoring vectors (`item_matrix`) for a dot-product one. An item another
    source adds to the FAISS list (`ranker.cooc.union`) is scored with these, on the scale FAISS scored the rest."""
    if model.similarity == "cosine":
        return unit.numpy()
    raw = item_matrix(model)
    return np.concatenate([np.zeros((1, raw.shape[1]), dtype=raw.dtype), raw])


def write_artifact(
    out: Path,
    model: Retriever,
    config: RunConfig,
    item_ids: np.ndarray,
    *,
    metrics: Mapping[str, Any] | None = None,
    dataset: Mapping[str, Any] | None = None,
    index_spec: IndexSpec | None = None,
    history: list[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    catalogue: Path | None = None,
    popularity: np.ndarray | None = None,
) -> RetrieverManifest:
    """Write the bundle into ``out`` (created if needed); returns the manifest.

    catalogue: a prepared folder's items.parquet, copied for the service's item metadata;
    popularity: (n_items + 1,) training counts per internal id.
    """
    out.mkdir(parents=True, exist_ok=True)
    n_items = len(item_ids)
    spec = index_spec or IndexSpec()
    atomic_write(out / CONFIG, lambda p: p.write_text(json.dumps(config.model_dump(mode="json"), indent=2)))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    atomic_torch_save(state, out / WEIGHTS)
    atomic_write(out / ITEM_IDS, lambda p: _save_npy(p, np.asarray(item_ids, dtype=str)))
    vectors = item_matrix(model)
    save_index(build_index(vectors, spec), out / INDEX)
    compiled = _write_compiled(out, model, config.max_len(n_items))
    files = [CONFIG, WEIGHTS, ITEM_IDS, INDEX, *_write_optional(out, n_items, history, catalogue, popularity)]
    files += [ENCODER_FILE] if compiled["encoder"] == "onnx" else []
    created = datetime.now(UTC)
    digest = {name: sha256_file(out / name) for name in files}
    manifest = {
        "format": FORMAT,
        "version": f"{created:%Y%m%dT%H%M%SZ}-{config.model.backbone}-{digest[WEIGHTS][:8]}",
        "created_at": created.isoformat(timespec="seconds"),
        "git_sha": _git_sha(),
        "seqrec_version": seqrec_version(),
        "backbone": config.model.backbone,
        "dim": int(vectors.shape[1]),
        "n_items": n_items,
        "max_len": config.max_len(n_items),
        "dataset": dict(dataset or {}),
        "metrics": dict(metrics or {}),
        "index": spec.to_dict(),
        "compiled": compiled,
        **dict(extra or {}),
        "sha256": digest,
    }
    return _write_manifest(out, manifest)


def _write_optional(out: Path, n_items: int, history: list[dict[str, Any]] | None, catalogue: Path | None,
                    popularity: np.ndarray | None) -> list[str]:
    """Write the files a bundle may lack (training log, item metadata, cold-start counts); returns their names."""
    files = []
    if history is not None:
        write_jsonl(out / HISTORY, history)
        files.append(HISTORY)
    if catalogue is not None:
        atomic_write(out / CATALOGUE, lambda p: shutil.copyfile(catalogue, p))
        files.append(CATALOGUE)
    if popularity is not None:
        counts = np.asarray(popularity, dtype=np.int64)
        if counts.shape != (n_items + 1,):
            raise ValueError(f"popularity must be shaped ({n_items + 1},), got {counts.shape}")
        atomic_write(out / POPULARITY, lambda p: _save_npy(p, counts))
        files.append(POPULARITY)
    return files


def rewrite_index(path: Path, spec: IndexSpec,
                  swap: Callable[[Path, Path], None] = replace_dir) -> RetrieverManifest:
    """Rebuild items.faiss with another index spec, (re)compile the encoder and update the manifest.

    The folder is rewritten as a staged copy that replaces it with renames (`replace_dir`): in place, a reader (a
    server reloading a published version) or a crash between the files and the manifest met new files under old
    checksums. Through a symlink (ARTIFACTS/current) the folder it names is replaced and the link kept. ``swap``
    replaces the folder by the staged copy (default `replace_dir`)."""
    path = Path(path).resolve()
    artifact = load_artifact(path, with_index=False)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        shutil.copytree(path, staging, symlinks=True, dirs_exist_ok=True)
        os.chmod(staging, path.stat().st_mode & 0o7777)  # mkdtemp's 0700 would lock out a server's other user
        save_index(build_index(item_matrix(artifact.model), spec), staging / INDEX)
        compiled = _write_compiled(staging, artifact.model, artifact.max_len)
        fields = artifact.manifest.to_dict()  # the file's keys, for writing back
        fields["index"] = spec.to_dict()
        fields["compiled"] = compiled
        digests = {name: d for name, d in fields["sha256"].items() if name != ENCODER_FILE}
        fields["sha256"] = {**digests, INDEX: sha256_file(staging / INDEX),
                            **({ENCODER_FILE: sha256_file(staging / ENCODER_FILE)}
                               if compiled["encoder"] == "onnx" else {})}
        manifest = _write_manifest(staging, fields)
        swap(staging, path)  # `seqrec export` brings over what a server wrote meanwhile (its catalogue journal)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _write_compiled(out: Path, model: Retriever, max_len: int) -> dict[str, Any]:
    """Write encoder.onnx when the backbone compiles; the manifest's record of what was compiled, or why not."""
    reason = write_encoder(out, model, max_len)
    if reason is None:
        return {"encoder": "onnx", "exporter": "torch.onnx (TorchScript)", "opset": OPSET, "torch": torch.__version__}
    log.info("the encoder stays eager: %s", reason)
    return {"encoder": "eager", "reason": reason}


def _write_manifest(out: Path, manifest: dict[str, Any]) -> RetrieverManifest:
    """Validate, then write ``manifest`` as given (its key order is the file's)."""
    record = RetrieverManifest.model_validate(manifest)
    atomic_write(out / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=2)))
    return record


def load_artifact(path: str | Path, *, with_index: bool = True, verify: bool = True,
                  device: str | torch.device = "cpu") -> RetrieverArtifact:
    """Rebuild the model from the folder alone; refuse it on any checksum or shape mismatch."""
    path = Path(path)
    manifest = read_manifest(path)
    if verify:
        verify_checksums(path, manifest)
    try:
        config = config_from_dict(json.loads((path / CONFIG).read_text()), source=str(path / CONFIG))
    except (OSError, ValueError) as err:
        raise ArtifactError(path / CONFIG, f"unusable config: {err}") from None
    try:
        item_ids = np.load(path / ITEM_IDS, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ArtifactError(path / ITEM_IDS, f"unreadable: {err}") from None
    n_items = len(item_ids)
    if n_items != manifest.n_items:
        raise ArtifactError(path / ITEM_IDS, f"holds {n_items} ids but the manifest says {manifest.n_items}")
    model = config.build(n_items)
    try:
        state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (RuntimeError, OSError, EOFError, ValueError) as err:  # shape mismatch, truncated or foreign file
        raise ArtifactError(path / WEIGHTS, f"does not fit the config's model: {first_line(err)}") from None
    model.to(device).eval()
    index = None
    if with_index:
        try:
            index = load_index(path / INDEX, IndexSpec.from_dict(manifest.index))
        except (RuntimeError, ValueError) as err:
            raise ArtifactError(path / INDEX, f"unreadable index: {first_line(err)}") from None
        if index.ntotal != n_items or index.d != manifest.dim:
            raise ArtifactError(path / INDEX, f"holds {index.ntotal} vectors of dim {index.d}; "
                                f"expected {n_items} of dim {manifest.dim}")
    return RetrieverArtifact(path, manifest, config, model, item_ids, index)


def verify_checksums(path: Path, manifest: RetrieverManifest) -> None:
    digests = manifest.sha256
    if digests is None or WEIGHTS not in digests:
        raise ArtifactError(path / MANIFEST, "lists no checksums")
    for name, expected in digests.items():
        file = path / name
        if not file.is_file():
            raise ArtifactError(file, "listed in the manifest but missing")
        if sha256_file(file) != expected:
            raise ArtifactError(file, "checksum does not match the manifest (changed, truncated or corrupt)")


def read_manifest(path: Path) -> RetrieverManifest:
    """PATH/manifest.json as the typed record, refused (ArtifactError) when missing, unreadable or incomplete."""
    if not path.is_dir():
        raise ArtifactError(path, "no such artifact folder")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise ArtifactError(path / MANIFEST, "missing; not a complete retriever artifact") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(path / MANIFEST, f"not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(path / MANIFEST, wrong_manifest(FORMAT, manifest))
    try:
        return RetrieverManifest.model_validate(manifest)
    except ValidationError as err:
        raise ArtifactError(path / MANIFEST, f"unusable: {validation_message(err)}") from None


def _save_npy(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as handle:  # a file handle, or np.save appends ".npy" to the temp name
        np.save(handle, array, allow_pickle=False)


def _git_sha() -> str | None:
    """The commit of the seqrec checkout this code runs from; None when installed (a wheel in a venv inside
    the user's own repository would otherwise report that repository's commit)."""
    package_root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=package_root, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != package_root:
        return None
    return lines[1]


