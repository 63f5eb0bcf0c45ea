"""A bundle: what one service process serves, loaded and validated.

A bundle is a retriever artifact folder (`retriever.artifact`), optionally with its ranker
(`BUNDLE/ranker/`), its catalogue and popularity counts. ``ARTIFACTS/current`` (a symlink or
a folder) names the bundle to serve. `load_bundle` checks checksums, shapes and the ranker's lineage,
then runs a smoke query through both stages, so a bundle that cannot answer is refused before it serves.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq
import torch

from common.errors import SeqrecError
from ranker.artifact import Ranker, RankerArtifact, load_ranker, unit_item_vectors
from ranker.compiled import load_lgbm, load_mlp
from ranker.lgbm import LGBMRanker
from ranker.mlp import MLPRanker
from ranker.tables import TorchTables
from retriever.artifact import (
    CATALOGUE,
    POPULARITY,
    ArtifactError,
    RetrieverArtifact,
    load_artifact,
    retrieval_rows,
)
from retriever.compiled import ExportRefused, load_encoder
from service.system.cache import UserVectors
from service.system.filters import CatalogueFilters
from service.system.recommend import Query, recommend_batch

CURRENT = "current"
Inference = Literal["auto", "onnx", "eager"]
log = logging.getLogger(__name__)
METADATA_COLUMNS = ("title", "year", "genres", "attributes")


class BundleError(SeqrecError):
    """A bundle that cannot be served; the message says which file and why."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    artifact: RetrieverArtifact
    ranker: RankerArtifact | None
    tables: TorchTables | None
    vectors: torch.Tensor  # (n_items + 1, D) unit item vectors, row 0 = 0
    index_of: dict[str, int]  # external id -> internal id (1..n_items)
    metadata: list[dict[str, Any]]  # row r = internal id r + 1; empty dicts without a catalogue
    popular: np.ndarray  # internal ids, most popular first (the cold-start answer)
    popularity: np.ndarray  # (n_items + 1,) training counts (or the ranker's popularity), the fallback's score
    loaded_at: float = field(default_factory=time.time)
    # The compiled encoder (retriever.compiled) when it serves, else None: the model runs eagerly.
    compiled_encoder: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False, compare=False)
    inference: dict[str, str] = field(default_factory=dict, compare=False)  # stage -> "onnx" | "eager"
    # Catalogue changes (service/system/catalog.py): internal ids never to recommend, the journal applied, and the
    # bundle as loaded from disk that they were applied to (None when this is it).
    retired: frozenset[int] = frozenset()
    changes: Any = None
    base: Bundle | None = None
    # stored users' vectors, keyed by user and history; a reload brings a new bundle, so an empty cache
    user_cache: UserVectors = field(default_factory=UserVectors, repr=False, compare=False)
    # For `find`: ids, lowercase titles and popularity ranks in popularity order, computed once at load.
    _by_popularity: list[tuple[int, str, str]] = field(init=False, repr=False, compare=False)
    popularity_rank: np.ndarray = field(init=False, repr=False, compare=False)  # (n_items + 1,), 1 = most popular
    filters: CatalogueFilters = field(init=False, repr=False, compare=False)  # per-column lookups of the catalogue
    # (n_items + 1, D) the model's scoring rows, row 0 = 0 (`retriever.artifact.retrieval_rows`, as offline):
    # ``vectors`` for a cosine model, the raw vectors for a dot-product one; a second source's candidates get
    # their retrieval scores from them.
    retrieval_rows: np.ndarray = field(init=False, repr=False, compare=False)
    # (n_items, D) the rows the FAISS index holds (its exact fallback scores them): ``retrieval_rows[1:]``.
    index_vectors: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        order = self.popular.tolist()
        rows = [(i, self.external(i), str(self.metadata[i - 1].get("title", "")).casefold()) for i in order]
        # Ranks over every item, retired ones included (a retired item had rank 0; retiring one shifts no other's):
        # the base bundle's order, then the added items, as `service.system.catalog.apply_changes` orders them.
        ranked = self.popular if self.base is None else np.concatenate(
            [self.base.popular, np.arange(self.base.n_items + 1, self.n_items + 1)])
        rank = np.zeros(self.n_items + 1, dtype=np.int64)
        rank[ranked] = np.arange(1, len(ranked) + 1)
        object.__setattr__(self, "_by_popularity", rows)
        object.__setattr__(self, "popularity_rank", rank)
        object.__setattr__(self, "filters", CatalogueFilters.from_metadata(self.metadata))
        scoring = retrieval_rows(self.artifact.model, self.vectors)
        object.__setattr__(self, "retrieval_rows", scoring)
        object.__setattr__(self, "index_vectors", scoring[1:])

    def encode(self, history: torch.Tensor) -> torch.Tensor:
        """(B, T) left-padded internal ids -> (B, D) float32 user vectors (not normalised): the one place the
        served encoder runs, compiled (ONNX Runtime) when the bundle loaded it so, else eagerly."""
        if self.compiled_encoder is not None:
            return self.compiled_encoder(history)
        with torch.inference_mode():
            return self.artifact.model.user_vectors(history).float()

    @property
    def version(self) -> str:
        return self.artifact.manifest.version

    @property
    def max_len(self) -> int:
        return self.artifact.max_len

    @property
    def n_items(self) -> int:
        return self.artifact.n_items

    @property
    def ranker_depth(self) -> int | None:
        """The candidates the ranker was mined, trained and evaluated on (None without a ranker)."""
        return None if self.ranker is None else self.ranker.depth

    def default_candidates(self, k: int) -> int:
        """A request's retrieval depth when it names none: the ranker's depth, the one that was measured.
        Without a ranker the top k is all there is to retrieve (a deeper search would return the same k)."""
        depth = self.ranker_depth
        return k if depth is None else depth

    @property
    def exclude_seen(self) -> bool:
        """A request's default: the repeat policy the bundle was evaluated under (exclude for old bundles)."""
        return self.artifact.manifest.exclude_seen

    def external(self, internal: int) -> str:
        return str(self.artifact.item_ids[internal - 1])

    def find(self, query: str, limit: int) -> tuple[list[int], bool]:
        """Internal ids matching ``query``, at most ``limit``, and whether more match: the item whose id is
        ``query`` first, then, most popular first, items whose id starts with it or whose title contains it
        (case-insensitively). An empty query lists the most popular items."""
        query = query.strip()
        exact = self.index_of.get(query)
        found = [] if exact is None else [exact]
        needle = query.casefold()
        for internal, item_id, title in self._by_popularity:
            if internal != exact and (item_id.startswith(query) or needle in title):
                found.append(internal)
                if len(found) > limit:
                    break
        return found[:limit], len(found) > limit

    def describe(self) -> dict[str, Any]:
        manifest = self.artifact.manifest
        return {
            "model_version": self.version,
            "path": str(self.path),
            "backbone": manifest.backbone,
            "n_items": self.n_items,
            "max_len": self.max_len,
            "repeats": manifest.repeats,
            "ranker": None if self.ranker is None else self.ranker.kind,
            "candidates": self.ranker_depth,
            "catalogue": bool(self.metadata and any(self.metadata)),
            "created_at": manifest.created_at,
            "inference": dict(self.inference),
        }


def resolve_bundle(artifacts: Path) -> Path:
    """``ARTIFACTS/current`` when it exists, else ``ARTIFACTS`` itself when it is a bundle."""
    artifacts = Path(artifacts)
    current = artifacts / CURRENT
    if current.exists():
        return current.resolve()
    if current.is_symlink():  # a version deleted by hand, or a folder moved without its versions/
        raise BundleError(f"{current} points at {os.readlink(current)}, which does not exist")
    if (artifacts / "manifest.json").is_file():
        return artifacts.resolve()
    if not artifacts.exists():
        raise BundleError(f"{artifacts}: no such folder (set SEQREC_ARTIFACTS or --artifacts)")
    # `seqrec demo` publishes into artifacts/demo, and `seqrec serve` reads artifacts: name what is one level down
    inside = sorted(str(sub) for sub in artifacts.iterdir() if (sub / CURRENT).exists()) if artifacts.is_dir() else []
    hint = f"; did you mean --artifacts {' or '.join(inside)}?" if inside else ""
    raise BundleError(f"{artifacts}: neither a bundle (no manifest.json) nor an artifacts folder with `{CURRENT}`"
                      f"{hint}")


def load_bundle(path: Path, *, inference: Inference = "auto", threads: int = 1) -> Bundle:
    """Load and validate a bundle: checksums, shapes, the ranker's lineage, the compiled path, then a smoke query.

    inference: ``auto`` serves the encoder and the MLP ranker through ONNX Runtime when they compile and match
    eager (`retriever.compiled`), else eagerly with one log line saying why; ``onnx`` refuses a bundle whose
    encoder (or MLP ranker) does not compile; ``eager`` never compiles. A LightGBM ranker's trees are compiled
    by lleaves unless ``eager`` (`ranker.compiled`), LightGBM predicting when they do not compile or match.
    threads: ONNX Runtime's intra-op threads.
    """
    path = Path(path)
    try:
        artifact = load_artifact(path)
        ranker = load_ranker(path, artifact.manifest)
    except ArtifactError as err:  # the retriever and the ranker folder alike
        raise BundleError(str(err)) from None
    n_items = artifact.n_items
    with torch.inference_mode():
        vectors = unit_item_vectors(artifact.model.item_vectors().detach())
    if vectors.shape[0] != n_items + 1:
        raise BundleError(f"{path}: the model scores {vectors.shape[0] - 1} items but item_ids.npy lists {n_items}")
    ids = [str(i) for i in artifact.item_ids.tolist()]
    index_of = {item: row + 1 for row, item in enumerate(ids)}
    if len(index_of) != n_items:
        raise BundleError(f"{path}: item_ids.npy holds duplicate ids")
    if ranker is not None:
        try:
            ranker.depth  # noqa: B018  the default request's depth: a ranker that records none is refused here
        except ArtifactError as err:
            raise BundleError(str(err)) from None
    encoder, ranker, record = compile_stages(path, artifact, ranker, inference, threads)
    bundle = Bundle(path, artifact, ranker, None if ranker is None else ranker.tables.torch(), vectors, index_of,
                    _metadata(path, ids), *_popular(path, artifact, ranker), compiled_encoder=encoder,
                    inference=record)
    _warn_if_cosine_index(bundle)
    _smoke(bundle)
    return bundle


def _warn_if_cosine_index(bundle: Bundle) -> None:
    """A dot-product model whose index holds unit vectors (written before the index held its scoring vectors)
    is served by cosine, not by what it was evaluated on: say so, and how to rebuild the index."""
    index = bundle.artifact.index
    if bundle.artifact.model.similarity != "dot" or index is None or index.ntotal == 0:
        return
    try:
        stored = np.asarray(index.reconstruct(0))
    except RuntimeError:  # an index that keeps no reconstructable rows (IVF without a direct map)
        return
    if not np.allclose(stored, bundle.index_vectors[0], atol=1e-4) and abs(float(np.linalg.norm(stored)) - 1) < 1e-4:
        log.warning("%s: the model scores by dot product but its FAISS index holds unit vectors, so it serves by "
                    "cosine; rebuild the index: seqrec export --artifact %s", bundle.path, bundle.path)


def compile_stages(path: Path, artifact: RetrieverArtifact, ranker: RankerArtifact | None, inference: Inference,
                   threads: int = 1) -> tuple[Callable[[torch.Tensor], torch.Tensor] | None, RankerArtifact | None,
                                              dict[str, str]]:
    """The compiled encoder (or None), the ranker with its MLP compiled where it can be, and what runs where.

    The offline evaluation, mining and the parity bench call this too (`offline.jobs.rank.user_encoder`,
    `offline.jobs.rank.served_scorer`): the
    compiled and the eager arithmetic agree to about 1e-6, enough to flip an exact near-tie, so the offline
    figures read the very numbers the service computes."""
    if inference not in ("auto", "onnx", "eager"):
        raise BundleError(f"inference must be auto, onnx or eager, got {inference!r}")
    record = {"encoder": "eager"}
    if ranker is not None:
        record["ranker"] = "eager" if isinstance(ranker.ranker, MLPRanker) else ranker.kind
    if inference == "eager":
        return None, ranker, record
    encoder = None
    try:
        written = artifact.manifest.compiled or {}
        if written.get("encoder") == "eager":  # refused when the bundle was written: the same reason holds
            raise ExportRefused(str(written.get("reason", "it did not compile when the bundle was written")))
        encoder = load_encoder(path, artifact.model, artifact.max_len, threads=threads)
        record["encoder"] = "onnx"
    except ExportRefused as err:
        _refused(path, "encoder", err, inference)
    if ranker is not None:
        try:
            compiled, how = compile_ranker(ranker.ranker, ranker.path, threads)
            ranker, record["ranker"] = replace(ranker, ranker=compiled), how
        except ExportRefused as err:
            if isinstance(ranker.ranker, MLPRanker):
                _refused(path, "MLP ranker", err, inference)
            else:  # never refused, not even under `onnx`: LightGBM's own predictor is native code too, only slower
                log.info("%s: LightGBM predicts for the ranker (not compiled): %s", path, err)
    return encoder, ranker, record


def compile_ranker(ranker: Ranker, folder: Path | None, threads: int = 1) -> tuple[Ranker, str]:
    """The ranker as the service runs it when it compiles, and how: the MLP through ONNX Runtime (FOLDER's
    mlp.onnx, or exported now: folder None) "onnx", LightGBM's trees through lleaves "lleaves"; raises
    ExportRefused with the reason otherwise (each compiled form is checked against eager first)."""
    if isinstance(ranker, MLPRanker):
        return load_mlp(folder, ranker, threads=threads), "onnx"
    if isinstance(ranker, LGBMRanker):
        return load_lgbm(ranker), "lleaves"
    raise ExportRefused(f"no compiled form for a {type(ranker).__name__}")


def _refused(path: Path, what: str, err: ExportRefused, inference: Inference) -> None:
    if inference == "onnx":
        raise BundleError(f"{path}: SEQREC_INFERENCE=onnx, but the {what} does not compile: {err}")
    log.info("%s: the %s runs eagerly: %s", path, what, err)


def _metadata(path: Path, ids: list[str]) -> list[dict[str, Any]]:
    file = path / CATALOGUE
    if not file.is_file():
        return [{} for _ in ids]
    try:
        table = pq.read_table(file)
    except (OSError, ValueError) as err:
        raise BundleError(f"{file}: unreadable catalogue: {err}") from None
    columns = [c for c in METADATA_COLUMNS if c in table.column_names]
    if "item_id" not in table.column_names:
        raise BundleError(f"{file}: the catalogue has no item_id column")
    rows = {str(r["item_id"]): r for r in table.select(["item_id", *columns]).to_pylist()}
    out = []
    for item in ids:
        row = rows.get(item, {})
        meta: dict[str, Any] = {}
        for column in columns:
            value = row.get(column)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if column in ("genres", "attributes"):
                meta[column] = [str(v) for v in value]
            elif column == "year":
                meta[column] = int(value)
            else:
                meta[column] = str(value)
        out.append(meta)
    return out


def _popular(path: Path, artifact: RetrieverArtifact, ranker: RankerArtifact | None) -> tuple[np.ndarray, np.ndarray]:
    n_items = artifact.n_items
    file = path / POPULARITY
    if file.is_file():
        counts = np.load(file, allow_pickle=False).astype(np.float64)
    elif ranker is not None:
        counts = ranker.tables.popularity.astype(np.float64)
    else:
        counts = np.zeros(n_items + 1)
    if counts.shape != (n_items + 1,):
        raise BundleError(f"{file}: popularity has shape {counts.shape}; expected ({n_items + 1},)")
    return np.argsort(-counts[1:], kind="stable") + 1, counts  # ties: catalogue order


def _smoke(bundle: Bundle) -> None:
    """A real query through every stage; a bundle that cannot answer it is refused."""
    history = list(range(1, min(bundle.n_items, 3) + 1))
    try:
        (result,) = recommend_batch(bundle, [Query(history, k=5, candidates=20, exclude_seen=True, rerank=True)])
    except Exception as err:  # a bundle that crashes on a plain query must never replace a working one
        raise BundleError(f"{bundle.path}: smoke query failed: {type(err).__name__}: {err}") from None
    expected = min(5, bundle.n_items - len(history))
    if len(result.items) != expected or not all(math.isfinite(s) for _, s, r in result.items for s in (s, r)):
        raise BundleError(f"{bundle.path}: smoke query returned {len(result.items)} items (expected {expected}) "
                          "or non-finite scores")
