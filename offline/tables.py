"""The one Markdown-table writer of the benches and reports: a header, its rule, one line per row.

Cells are written with ``str`` and any ``|`` inside one is escaped, so a cell (an error message,
a note) can never add a column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_row(cells: Iterable[Any]) -> str:
    """``| a | b |``"""
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def markdown_header(head: Sequence[Any]) -> str:
    """The header line and the rule under it (for tables printed a row at a time)."""
    return markdown_row(head) + "\n|" + "---|" * len(head)


def markdown_table(head: Sequence[Any], rows: Iterable[Iterable[Any]]) -> str:
    """The whole table, lines joined with newlines (no newline after the last)."""
    return "\n".join([markdown_header(head), *(markdown_row(row) for row in rows)])
