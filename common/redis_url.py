"""A Redis URL checked as redis-py reads it, and shown without its password: the service, `seqrec recommend` and
`seqrec tune` all take Redis URLs."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def check_redis_url(url: str) -> str:
    """``url`` as redis-py reads it, or a ValueError: a port or query value it cannot read was an internal error at
    start-up, and a database that is no number (``/abc``) silently database 0."""
    from urllib.parse import unquote, urlsplit

    from redis.connection import parse_url

    try:
        parse_url(url)
        parts = urlsplit(url)
        _ = parts.port  # a ValueError when not a number
    except ValueError as err:
        raise ValueError(str(err)) from None
    database = unquote(parts.path).strip("/")
    if not url.startswith("unix://") and database and not database.isdigit():
        raise ValueError(f"the database {database!r} is not a number")
    return url


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
