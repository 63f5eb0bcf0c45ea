"""Business filters: which catalogue items a request may be recommended.

A request (or a `seqrec recommend` run) narrows the catalogue three ways, all ANDed:

    include_items  an allow-list of external ids
    exclude_items  external ids never to return
    filters        conditions on the catalogue's columns, ANDed over columns:
                   {"genres": ["Comedy", "Drama"]}         any of (list columns: genres, attributes)
                   {"genres": "Comedy"}                    has it
                   {"year": {"gte": 1990, "lt": 2000}}     every operator holds
                   {"year": [1994, 1995]} / {"year": 1995} in / eq
                   operators: eq, ne, in (a list), gte, gt, lte, lt; list columns take eq (has), ne (lacks)
                   and in (has any); text columns (title) eq, ne, in; {} = no condition

An item without a value in a column matches no condition on it, and so does every item of a catalogue
without that column (a Beauty bundle has no `year`: a year filter leaves nothing). A column other than
genres, attributes, year and title, an unknown operator or an operand of the wrong type is a 422
(`service.http.schemas.Filters` refuses it; `FilterError` here, for callers that skip the schema). Item ids
unknown to the catalogue in include/exclude are ignored and reported in the response's ``unknown_items``.

`CatalogueFilters` holds per-column lookups built once when a bundle loads (`service.system.loader`):
value -> rows for list and text columns, a float array for numbers, so a request's mask costs a few
vectorised operations. The mask is over index rows (row r = internal id r + 1) and goes to the
retrieval stage (`retriever.index.filtered`), so candidates are drawn from eligible items only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import SeqrecError

OPERATORS = ("eq", "ne", "in", "gte", "gt", "lte", "lt")
_ORDER = {"gte": np.greater_equal, "gt": np.greater, "lte": np.less_equal, "lt": np.less}
LIST_COLUMNS = ("genres", "attributes")
NUMBER_COLUMNS = ("year",)
TEXT_COLUMNS = ("title",)
FILTER_COLUMNS = (*LIST_COLUMNS, *NUMBER_COLUMNS, *TEXT_COLUMNS)


class FilterError(SeqrecError):
    """A filter that names an unknown column or operator, or an operand of the wrong type."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field  # dotted path: "filters.year.gte"
        self.message = message


@dataclass(frozen=True)
class CatalogueFilters:
    n_items: int
    values: dict[str, dict[str, np.ndarray]]  # list and text columns: value -> rows holding it
    numbers: dict[str, np.ndarray]  # number columns: (n_items,) float64, NaN = no value

    @classmethod
    def from_metadata(cls, metadata: Sequence[Mapping[str, Any]]) -> CatalogueFilters:
        """The lookups of every column some item has (``metadata[r]`` describes row r)."""
        present = {column for meta in metadata for column in meta}
        values: dict[str, dict[str, np.ndarray]] = {}
        for column in (c for c in (*LIST_COLUMNS, *TEXT_COLUMNS) if c in present):
            rows: dict[str, list[int]] = {}
            for r, meta in enumerate(metadata):
                held = meta.get(column)
                for value in (held if isinstance(held, list) else () if held is None else (held,)):
                    rows.setdefault(str(value), []).append(r)
            values[column] = {value: np.array(r, dtype=np.int64) for value, r in rows.items()}
        numbers = {column: np.array([float(meta.get(column, math.nan)) for meta in metadata])
                   for column in NUMBER_COLUMNS if column in present}
        return cls(len(metadata), values, numbers)

    @property
    def columns(self) -> list[str]:
        return sorted([*self.values, *self.numbers])

    def mask(self, filters: Mapping[str, Any]) -> np.ndarray:
        """(n_items,) bool: the rows every condition of ``filters`` holds for."""
        out = np.ones(self.n_items, dtype=bool)
        for column, condition in filters.items():
            if column not in FILTER_COLUMNS:
                raise FilterError(f"filters.{column}", "unknown column; filterable columns: "
                                  + ", ".join(FILTER_COLUMNS))
            for op, operand in _conditions(column, condition):
                if column not in self.values and column not in self.numbers:
                    _check_operand(column, op, operand)
                    out[:] = False  # no item has a value in a column the catalogue lacks
                else:
                    out &= self._holds(column, op, operand)
        return out

    def _holds(self, column: str, op: str, operand: Any) -> np.ndarray:
        field = f"filters.{column}.{op}"
        if column in self.numbers:
            return _number_mask(self.numbers[column], op, operand, field)
        lookup = self.values[column]
        if op in _ORDER:
            kind = "a list" if column in LIST_COLUMNS else "a text"
            raise FilterError(field, f"{column} is {kind} column; its operators are eq, ne, in")
        wanted = _texts(operand, field, many=op == "in")
        hit = np.zeros(self.n_items, dtype=bool)
        for value in wanted:
            rows = lookup.get(value)
            if rows is not None:
                hit[rows] = True
        if op == "ne":
            has_value = np.zeros(self.n_items, dtype=bool)
            for rows in lookup.values():
                has_value[rows] = True
            return has_value & ~hit
        return hit


def _conditions(column: str, condition: Any) -> list[tuple[str, Any]]:
    """(operator, operand) pairs: a bare list is ``in``, a bare value ``eq``, a dict names its operators."""
    if isinstance(condition, list):
        return [("in", condition)]
    if not isinstance(condition, dict):
        return [("eq", condition)]
    for op in condition:
        if op not in OPERATORS:
            raise FilterError(f"filters.{column}.{op}", "unknown operator; choose one of " + ", ".join(OPERATORS))
    return list(condition.items())


def _check_operand(column: str, op: str, operand: Any) -> None:
    """The type checks of a condition on a column this catalogue lacks (it matches nothing, but must be valid)."""
    field = f"filters.{column}.{op}"
    if column in NUMBER_COLUMNS:
        _number_mask(np.empty(0), op, operand, field)
    elif op in _ORDER:
        raise FilterError(field, f"{column} takes eq, ne, in")
    else:
        _texts(operand, field, many=op == "in")


def _texts(operand: Any, field: str, *, many: bool) -> list[str]:
    values = operand if many else [operand]
    if many and not isinstance(operand, list):
        raise FilterError(field, "in takes a list")
    if not values or not all(isinstance(v, str) for v in values):
        raise FilterError(field, "takes " + ("a non-empty list of strings" if many else "a string"))
    return list(values)


def _number_mask(values: np.ndarray, op: str, operand: Any, field: str) -> np.ndarray:
    def number(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise FilterError(field, "takes a finite number" + (" list" if op == "in" else ""))
        return float(v)

    known = ~np.isnan(values)
    if op == "in":
        if not isinstance(operand, list) or not operand:
            raise FilterError(field, "in takes a non-empty list of numbers")
        return known & np.isin(values, [number(v) for v in operand])
    target = number(operand)
    if op == "eq":
        return known & (values == target)
    if op == "ne":
        return known & (values != target)
    return known & _ORDER[op](values, target)


def eligible(catalogue: CatalogueFilters, index_of: Mapping[str, int], *, filters: Mapping[str, Any] | None = None,
             include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
             ) -> tuple[np.ndarray | None, list[str]]:
    """The allowed rows (None: no restriction) and the include/exclude ids unknown to the catalogue."""
    if filters is None and include is None and exclude is None:
        return None, []
    allowed = catalogue.mask(filters) if filters else np.ones(catalogue.n_items, dtype=bool)
    unknown: list[str] = []
    if include is not None:
        rows = _rows(include, index_of, unknown)
        only = np.zeros(catalogue.n_items, dtype=bool)
        only[rows] = True
        allowed &= only
    if exclude is not None:
        allowed[_rows(exclude, index_of, unknown)] = False
    return allowed, list(dict.fromkeys(unknown))


def _rows(ids: Iterable[str], index_of: Mapping[str, int], unknown: list[str]) -> np.ndarray:
    rows = []
    for item in ids:
        internal = index_of.get(item)
        if internal is None:
            unknown.append(item)
        else:
            rows.append(internal - 1)
    return np.array(rows, dtype=np.int64)
