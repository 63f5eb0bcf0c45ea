"""A Redis URL checked as redis-py reads it, and shown without its password: the service, `seqrec recommend` and
`seqrec tune` all take Redis URLs.

The service's history store also takes a Redis Cluster: ``redis+cluster://[user:password@]host:port`` (or
``rediss+cluster://`` for TLS) names one node of it, from which redis-py's cluster client learns the others. A
cluster has database 0 only; redis-py itself knows no such scheme (`cluster_node_url` gives the node's plain URL)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # -> the scheme of each node's URL


def cluster_node_url(url: str) -> str | None:
    """The plain ``redis://`` (``rediss://``) URL of the node a ``redis+cluster://`` URL names; None for any other
    URL (a single Redis)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower()) if sep else None
    return None if plain is None else f"{plain}://{rest}"


def check_redis_url(url: str, *, cluster: bool = False) -> str:
    """``url`` as redis-py reads it, or a ValueError: a port or query value it cannot read was an internal error at
    start-up, and a database that is no number (``/abc``) silently database 0. A ``redis+cluster://`` URL only
    where ``cluster`` allows one (the history store), and then with database 0 or none."""
    from urllib.parse import unquote, urlsplit

    from redis.connection import parse_url

    node = cluster_node_url(url)
    if node is not None and not cluster:
        raise ValueError("a Redis Cluster URL (redis+cluster://) is only for the service's history store")
    checked = url if node is None else node
    try:
        parse_url(checked)
        parts = urlsplit(checked)
        _ = parts.port  # a ValueError when not a number
    except ValueError as err:
        raise ValueError(str(err)) from None
    database = unquote(parts.path).strip("/")
    if not url.startswith("unix://") and database and not database.isdigit():
        raise ValueError(f"the database {database!r} is not a number")
    if node is not None and database and int(database) != 0:
        raise ValueError(f"a Redis Cluster has database 0 only, not {database}")
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
