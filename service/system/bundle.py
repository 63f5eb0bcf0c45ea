"""A bundle: what one service process serves, as loaded and validated (`service.system.loader` loads it).

A bundle is a retriever artifact folder (`retriever.artifact`), optionally with its ranker
(`BUNDLE/ranker/`), its catalogue and popularity counts. The two stages (`service.system.recommend`) read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import SeqrecError
from ranker.artifact import RankerArtifact
from ranker.tables import TorchTables
from retriever.artifact import RetrieverArtifact, retrieval_rows
from service.system.cache import UserVectors
from service.system.encode import raw_user_vectors
from service.system.filters import CatalogueFilters


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
    pending_count: int = 0  # added items without a vector in this model (they wait for the next training)
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
        return raw_user_vectors(self.artifact.model, self.compiled_encoder, history)

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


