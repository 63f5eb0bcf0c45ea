"""The one error root. Every problem a user can fix (bad input, a missing file, a wrong flag, an
unusable artifact) raises a `SeqrecError`; the CLI prints it as one line and the service turns it into
a 4xx. It lives in `common`, the package every other one may import."""

from __future__ import annotations

from pydantic import ValidationError


class SeqrecError(Exception):
    """A problem the user can fix: bad input, a missing file, a wrong flag."""


class RetrieverError(SeqrecError, ValueError):
    """A retriever config or model that cannot be used (also a ValueError, as it always was)."""


def first_line(err: BaseException, limit: int | None = None) -> str:
    """An exception's message cut to its first line (at most ``limit`` characters), or its type's name when it
    has none: errors are one line on stderr, and a library's message may run to a traceback's length."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__


def validation_message(err: ValidationError, *, prefix: str = "", upper: bool = False) -> str:
    """One line for a pydantic error: ``loc.path: msg; other.loc: msg`` (``prefix`` before each location,
    locations upper-cased with ``upper``, as environment variable names are)."""
    problems = []
    for error in err.errors():
        if error["type"] == "default_factory_not_called":  # a consequence of another error, listed beside it
            continue
        where = ".".join(str(part) for part in error["loc"])
        problems.append(f"{prefix}{where.upper() if upper else where}: {error['msg']}")
    return "; ".join(problems)
