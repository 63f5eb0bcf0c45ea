"""What a Redis error says of the server, and a Redis URL as it may be shown.

The history store (`service.http.store`) turns every error below into ``StoreUnavailable`` (the API's 503 with
Retry-After); `seqrec serve` probes Redis once before it starts (`refused_configuration`) and stops on a
configuration Redis refuses; URLs are printed through `common.redis_url.redact_url`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

import redis
import redis.exceptions as rex

from common.errors import SeqrecError
from common.redis_url import cluster_node_url, redact_url

log = logging.getLogger(__name__)
PROBE_MS = 10_000  # how long the probe key that tells whether Redis takes writes lives (`probe`)

# Errors that mean "the store cannot serve right now, try again later", as opposed to a bug or bad data.
# ConnectionError covers refused/reset sockets, BusyLoadingError, MaxConnectionsError, a refused password and
# the blocking pool's "No connection available"; OSError covers socket errors redis-py lets through (and builtin
# TimeoutError). A Redis that refuses writes (replica, maxmemory reached) is also a "retry later" for the client.
# So is any other error Redis answers (a database number it lacks, an ACL that forbids the prefix's keys, a key
# of another type under the prefix): the server's configuration is wrong, not the request, and `seqrec serve`
# refuses to start on the first two. A Redis Cluster's client adds its own (RedisClusterException, no RedisError):
# no node reachable, a slot no master serves.
REFUSED: tuple[type[BaseException], ...] = (rex.AuthenticationError, rex.AuthorizationError)
UNREACHABLE: tuple[type[BaseException], ...] = (rex.ConnectionError, rex.TimeoutError, OSError,
                                                rex.RedisClusterException)
STORE_ERRORS: tuple[type[BaseException], ...] = (*UNREACHABLE, rex.RedisError)
REFUSES_WRITES: tuple[type[BaseException], ...] = (rex.ReadOnlyError, rex.OutOfMemoryError)


class StoreUnavailable(SeqrecError):
    """The history store cannot serve now (down, timing out, loading, full, refusing the request); the API maps
    it to 503 with ``public``, which names no address (the message itself, for the log, names the redacted URL)."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public


def foreign_user(error: BaseException, users: Sequence[str]) -> str:
    """``user 'x'`` for the user whose key a WRONGTYPE error is about: the append script names the user's place in
    its batch (`service.http.store_lua`); a command on one user's keys is about that user. Else ``a user``."""
    found = re.search(r"WRONGTYPE user (\d+) ", str(error))
    if found and int(found.group(1)) < len(users):
        return f"user {users[int(found.group(1))]!r}"
    return f"user {users[0]!r}" if len(users) == 1 else "a user"




def redis_state(error: BaseException) -> str:
    """What a Redis error says of the server, for a message: "is unreachable", "did not answer in time", "refuses
    writes" or "refused the request" (an error it answered: a password, a database number it lacks, an ACL's
    NOPERM)."""
    if isinstance(error, rex.TimeoutError | TimeoutError):
        # the command was sent: Redis may still run it (an append script once Redis resumes), so say so
        return "did not answer in time (a write may still be applied)"
    if isinstance(error, UNREACHABLE) and not isinstance(error, REFUSED):
        return "is unreachable"
    return "refuses writes" if isinstance(error, REFUSES_WRITES) else "refused the request"


def refused_configuration(url: str, prefix: str, timeout_s: float = 2.0) -> str | None:
    """Why Redis at ``url`` refuses this configuration, in one line: a password it rejects, a database number it
    lacks, an ACL without the prefix's keys. Each would fail every request the same way, so `seqrec serve` stops
    on it before it starts. None when Redis takes a probe write under the prefix (expiring in 10 s), or when it
    only cannot for now (down, loading, full, a read-only replica): the service starts then, with a warning, and
    answers 503 on the store's routes until Redis is back."""
    client: redis.Redis | redis.RedisCluster | None = None
    try:
        node = cluster_node_url(url)  # a cluster's client reads the slot map when made: inside the try
        client = (redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s) if node is None
                  else redis.RedisCluster.from_url(node, socket_connect_timeout=timeout_s, socket_timeout=timeout_s))
        client.set(*probe(prefix), px=PROBE_MS)
    except STORE_ERRORS as e:
        state, reason = redis_state(e), str(e) or type(e).__name__
        if state == "refused the request":
            return reason
        log.warning("Redis at %s %s now (%s); starting without it: the store's routes answer 503 until it is "
                    "back", redact_url(url), state, reason)
    finally:
        if client is not None:
            client.close()
    return None


def probe(prefix: str) -> tuple[str, str]:
    """The key and value a write probe sets: ``{prefix}probe``, this process's id."""
    return f"{prefix}probe", str(os.getpid())
