"""Ranker feature groups: each declared once, in its own module of this package, and found by import.

A group (`FeatureGroup`) names its columns, the tables it reads beyond the item tables every ranker has
(`TableKind`: a file beside the ranker, built from training positions only), the facts the data must have
(timestamps), which columns come from the retriever's ID-trained vectors or the item's own interactions
(zeroed for an unknown item), and one function that computes every column for a batch (`Inputs`).

Base groups (``base`` set: their position) are read by every ranker, in that order; the others are optional:
a ranker reads the optional columns its config names, after the base ones, and its manifest lists every
column it reads (``features.dense``), so a saved ranker loads by the groups those columns belong to, and a
group added later leaves every saved ranker loadable. Adding a group is one module here (plus its test):
the module builds its `FeatureGroup` (and any `TableKind`) and calls `register`; nothing else names it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ranker.tables import TableArrays

# what a group may require of the data; "timestamps": the interactions have times, and each request is scored as of
# its time (``Inputs.at``)
FACTS = ("timestamps",)


def log1p32(x: np.ndarray) -> np.ndarray:
    """torch's float32 log1p (numpy's may differ by an ulp, and trained rankers saw torch's values)."""
    return torch.log1p(torch.from_numpy(x)).numpy()


@dataclass(frozen=True)
class Inputs:
    """One batch of B requests with N candidates each, as every group's ``compute`` reads it (numpy arrays share
    the tensors' memory). Fields a caller cannot give are None (a group that needs them says so)."""

    history: np.ndarray  # (B, T) left-padded internal ids
    candidates: np.ndarray  # (B, N) internal ids, 0 = empty slot
    unknown: np.ndarray  # (B, N) bool: an ID not to trust (never trained, masked, or an empty slot)
    history_t: Tensor  # the same three as tensors
    candidates_t: Tensor
    unknown_t: Tensor
    tables: Mapping[str, Any]  # runtime tables by `TableKind` name
    arrays: TableArrays | None = None  # the item tables every ranker has
    vectors: np.ndarray | None = None  # (n_items + 1, D) unit retriever item vectors
    scores: np.ndarray | None = None  # (B, N) the retriever's cosine scores
    at: Tensor | None = None  # (B,) request times in seconds
    last_event: Tensor | None = None  # (B,) each user's newest interaction time, NaN unknown

    @functools.cached_property
    def valid(self) -> np.ndarray:
        return self.candidates != 0

    @functools.cached_property
    def hist_valid(self) -> np.ndarray:
        return self.history != 0

    @functools.cached_property
    def hist_len(self) -> np.ndarray:
        """(B,) history lengths, at least 1 (a divisor)."""
        return np.maximum(self.hist_valid.sum(1), 1)

    @functools.cached_property
    def candidate_vectors(self) -> np.ndarray:
        """(B, N, D) the candidates' unit retriever vectors."""
        if self.vectors is None:
            raise ValueError("these features need the retriever's item vectors")
        return self.vectors[self.candidates]

    @functools.cached_property
    def meta(self) -> np.ndarray:
        """(B, N, M) the candidates' metadata value ids (0 = none)."""
        return self.item_arrays().meta[self.candidates]

    def item_arrays(self) -> TableArrays:
        if self.arrays is None:
            raise ValueError("these features are computed with the base columns (`ranker.features.compute_features`)")
        return self.arrays


Columns = Mapping[str, "np.ndarray | Tensor"]  # name -> (B, N) values (or (B, 1), broadcast)


@dataclass(frozen=True)
class FeatureGroup:
    name: str
    columns: tuple[str, ...]
    compute: Callable[[Inputs], Columns]  # every column of the group for the batch
    doc: str = ""
    base: int | None = None  # position among the base groups; None: optional (read when a config names it)
    tables: tuple[str, ...] = ()  # `TableKind` names it reads
    id_derived: tuple[str, ...] = ()  # zeroed for unknown candidates
    requires: tuple[str, ...] = ()  # of FACTS


@dataclass(frozen=True)
class TableKind:
    """A table an optional group reads, saved as ``file`` beside the ranker (numpy arrays, no pickle)."""

    name: str
    file: str
    build: Callable[[np.ndarray, np.ndarray, np.ndarray | None, int], Any]  # offsets, items, times, n_items
    load: Callable[[Path], Any]  # the table's class has save(path) and n_items
    runtime: Callable[[Any], Any] = lambda table: table  # what ``Inputs.tables`` holds for it


_GROUPS: dict[str, FeatureGroup] = {}
_TABLES: dict[str, TableKind] = {}
_loaded = False
_sorted: list[FeatureGroup] | None = None  # groups() until the next register / unregister


def register(group: FeatureGroup) -> FeatureGroup:
    """Add a group (its module calls this at import); refused when a name or a column is taken."""
    taken = {column: g.name for g in _GROUPS.values() for column in g.columns}
    clash = [c for c in group.columns if c in taken and taken[c] != group.name]
    if clash or len(set(group.columns)) != len(group.columns):
        raise ValueError(f"feature group {group.name!r}: columns {clash or list(group.columns)} are taken or repeated")
    unknown = [t for t in group.tables if t not in _TABLES] + [f for f in group.requires if f not in FACTS]
    if unknown or not set(group.id_derived) <= set(group.columns):
        raise ValueError(f"feature group {group.name!r}: unknown tables or facts {unknown}, or id_derived columns "
                         "outside its columns")
    global _sorted
    _GROUPS[group.name] = group
    _sorted = None
    return group


def register_table(kind: TableKind) -> TableKind:
    _TABLES[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a group (tests that add one)."""
    global _sorted
    _GROUPS.pop(name, None)
    _sorted = None


def _load() -> None:
    """Import every module of this package once (each registers its groups)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            importlib.import_module(f"{__name__}.{module}")


def groups() -> list[FeatureGroup]:
    """Every registered group: the base ones in their order, then the optional ones by name."""
    global _sorted
    _load()
    if _sorted is None:
        _sorted = sorted(_GROUPS.values(), key=lambda g: (g.base is None, g.base or 0, g.name))
    return list(_sorted)


def base_groups() -> list[FeatureGroup]:
    return [g for g in groups() if g.base is not None]


def base_columns() -> tuple[str, ...]:
    return tuple(c for g in base_groups() for c in g.columns)


def optional_columns() -> tuple[str, ...]:
    return tuple(c for g in groups() if g.base is None for c in g.columns)


def table_kind(name: str) -> TableKind:
    _load()
    return _TABLES[name]


def group_of(column: str) -> FeatureGroup:
    """The group computing ``column``; KeyError when none does."""
    for group in groups():
        if column in group.columns:
            return group
    raise KeyError(column)


def resolve(names: Sequence[str]) -> list[FeatureGroup]:
    """The optional groups that the columns ``names`` belong to (in first-use order); ValueError naming the
    columns no registered optional group computes."""
    known = optional_columns()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown ranker features {unknown}; choose from {', '.join(known)}")
    found: dict[str, FeatureGroup] = {}
    for name in names:
        group = group_of(name)
        found.setdefault(group.name, group)
    return list(found.values())


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    resolve(names)
    return tuple(names)


def tables_for(names: Sequence[str]) -> tuple[str, ...]:
    """The table kinds the optional columns ``names`` read."""
    return tuple(dict.fromkeys(t for g in resolve(names) for t in g.tables))


def requiring(names: Sequence[str], fact: str) -> list[str]:
    """The columns among ``names`` whose group requires ``fact`` of the data."""
    return [n for n in names if fact in group_of(n).requires]


def iter_base(inputs: Inputs) -> Iterator[tuple[str, Any]]:
    """(column, values) of every base column, in order."""
    for group in base_groups():
        values = group.compute(inputs)
        for column in group.columns:
            yield column, values[column]


@dataclass(frozen=True)
class Extras:
    """The optional columns a ranker reads, in order, and the runtime tables they come from (by kind name)."""

    names: tuple[str, ...]
    tables: Mapping[str, Any] | None = None

    @property
    def needs_time(self) -> bool:
        return bool(requiring(self.names, "timestamps"))
