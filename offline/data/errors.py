"""Errors of the data readers: they name the file and, where known, the line."""

from __future__ import annotations

from pathlib import Path

from common.errors import SeqrecError


class DataError(SeqrecError):
    """Input data that cannot be read; names the file and, where known, the line."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.reason = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")
