"""The Redis client of `service.http.store.RedisStore`: one Redis, or a Redis Cluster; and an append that waits for
replicas.

**A cluster** (``SEQREC_REDIS_URL=redis+cluster://host:port``, any one node; `common.redis_url.cluster_node_url`)
is served through redis-py's asyncio ``RedisCluster``, which reads the slot map from that node and sends each
command to the master that owns its keys' slot. A user's keys are tagged ``{user_id}`` (one hash slot), so each
user's append is one script call on one master and each read one MULTI block there. A script may only touch keys
of one slot, so a batch of several users (``append_many``) is sent as one script call per slot, all at once: each
user's events are applied all or nothing, but a batch across slots is not (one slot's call can fail while
another's succeeds; the API then answers 503 and a retry adds nothing twice that carries a timestamp). The
previous release's key names (``{prefix}history:{user}``) lie in other slots: they are not read in cluster mode.
The script is cached per node: after a failover the promoted replica answers NOSCRIPT once and it is loaded again.

**A failover** is handled here, not by redis-py's retries: its cluster client makes one attempt per command
(``retries=0``), because its own retry paths differ by call (a command re-reads the slot map before its retry; a
MULTI read does so only every fifth error, so reads to a dead master's slots kept failing after its replica took
over; a pipeline closes every connection of the client and sleeps 0.25 s). `through_failover` runs each store
call: on a lost connection, CLUSTERDOWN, an uncovered slot, MOVED or TRYAGAIN it re-reads the slot map (one read
for all the calls that failed meanwhile, `SlotMap`) and tries once more; on a timeout it re-reads the map but does
not retry (the command may still run). So once the cluster is whole again the first call to a moved slot pays one
map read and succeeds; while a master is down a call fails within about two connect attempts and one map read,
and never later than the store's deadline (4 x ``SEQREC_REDIS_TIMEOUT_MS``): a 503 with Retry-After, no hang.
Normal operation sends nothing more.

**WAIT** (``SEQREC_REDIS_WAIT_REPLICAS=N``): the append script and ``WAIT N timeout`` go in one pipeline, so on one
connection to the master that ran the script (WAIT counts that connection's writes). Fewer than N replicas
confirming within ``SEQREC_REDIS_WAIT_MS`` is a 503: the master has applied the append (it is not rolled back),
but it may not survive the master's loss. Without WAIT, replication is asynchronous: a master killed before its
replica copied the last appends loses them when the replica takes over (`seqrec bench cluster-failover` counts
them). ``appendfsync always`` on every node is the other durability lever (a restart keeps what was
acknowledged); WAIT is the one that covers losing the machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from common.redis_url import cluster_node_url

Client = aioredis.Redis | RedisCluster
T = TypeVar("T")


def redis_client(url: str, *, pool_size: int, timeout_s: float) -> Client:
    """A client of the Redis (or the Redis Cluster) at ``url``; nothing is connected until the first command.

    One immediate retry on connection errors only: it replaces a pooled connection that died while idle (Redis
    restarted) without the caller noticing. A cluster's client makes one attempt (`through_failover` retries).
    Timeouts are not retried, so a hung Redis costs one timeout; a down one is refused at once. redis-py's
    default (3 retries with backoff) would be slower. The single Redis's pool blocks up to the timeout for a free
    connection instead of failing under bursts; a cluster's pools (one per node, ``pool_size`` each) refuse at
    once when full (a 503)."""
    retry = Retry(NoBackoff(), retries=1, supported_errors=(rex.ConnectionError,))
    node = cluster_node_url(url)
    if node is not None:  # no retry inside redis-py: `through_failover` does it
        return RedisCluster.from_url(node, max_connections=pool_size, socket_connect_timeout=timeout_s,
                                     socket_timeout=timeout_s, retry=Retry(NoBackoff(), retries=0))
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=timeout_s, socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s, retry=retry)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes both


def slot_groups(first_keys: Sequence[str]) -> list[list[int]]:
    """The positions of ``first_keys`` (one key per user: every key of a user shares its slot) grouped by hash
    slot, each group in the order given, the groups in the order of their first member."""
    groups: dict[int, list[int]] = {}
    for position, key in enumerate(first_keys):
        groups.setdefault(key_slot(key.encode()), []).append(position)
    return list(groups.values())


async def by_slot(first_keys: Sequence[str], run: Callable[[list[int]], Awaitable[list[int]]]) -> list[int]:
    """``run(positions)`` for each group of `slot_groups`, all at once; its replies (one per position) put back in
    the order of ``first_keys``. The first failure is raised once every call has ended."""
    groups = slot_groups(first_keys)
    replies = await asyncio.gather(*(run(group) for group in groups), return_exceptions=True)
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    out = [0] * len(first_keys)
    for group, reply in zip(groups, replies, strict=True):
        for position, value in zip(group, reply, strict=True):  # type: ignore[arg-type]
            out[position] = value
    return out


async def connected(client: Client) -> Client:
    """The client, a cluster's slot map read first: redis-py's cluster client read it lazily, and a burst of first
    commands at once (a new worker under load, a batch's per-slot calls) broke connections it was still opening."""
    if isinstance(client, RedisCluster):
        await client.initialize()  # a no-op once read (and after a failover, which marks it to be read again)
    return client


def dropped_mid_command(error: BaseException) -> bool:
    """An AttributeError or RuntimeError raised inside redis-py's connection code: its asyncio cluster client (8.1)
    closes a connection that another request is still using when a failover makes it re-read the slot map
    (``'NoneType' object has no attribute 'writelines'``; uvloop's ``unable to perform operation on
    <TCPTransport closed=True ...>``). A lost connection, so a retry or a 503; any other is a bug."""
    if not isinstance(error, AttributeError | RuntimeError):
        return False
    deepest_redis_frame = ""
    tb = error.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        deepest_redis_frame = name if "/redis/" in name else deepest_redis_frame
        tb = tb.tb_next
    return deepest_redis_frame.endswith("redis/asyncio/connection.py")


# The slot map may be stale or the node gone: re-read the map and try once more. Not a full pool (the node is
# fine), a refused password, a loading replica, nor a timeout (the command may still run: retrying could apply an
# append twice, and would double the wait).
_MOVED = (rex.ConnectionError, rex.ClusterDownError, rex.SlotNotCoveredError, rex.AskError, rex.TryAgainError)
_NOT_MOVED = (rex.MaxConnectionsError, rex.AuthenticationError, rex.BusyLoadingError)


class SlotMap:
    """Re-reads a cluster's slot map once for all the calls that failed since the last read."""

    def __init__(self, client: RedisCluster) -> None:
        self.client, self.reads = client, 0
        self._lock = asyncio.Lock()

    async def refresh(self, reads_seen: int) -> None:
        """Read the map unless it was read after ``reads_seen`` (the count when the failed call began)."""
        async with self._lock:
            if self.reads == reads_seen:
                try:
                    await self.client.nodes_manager.initialize()
                finally:
                    self.reads += 1  # a failed read too: the next failure tries again, not its waiters


async def through_failover(slot_map: SlotMap | None, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``; on a cluster, once more after a slot-map read when it failed because the map was stale or a
    node was lost (`_MOVED`). After a timeout the map is read and the timeout raised."""
    if slot_map is None:
        return await call()
    reads_seen = slot_map.reads
    try:
        return await call()
    except (rex.TimeoutError, TimeoutError):
        await slot_map.refresh(reads_seen)
        raise
    except _NOT_MOVED:
        raise
    except (*_MOVED, AttributeError, RuntimeError) as e:
        if isinstance(e, AttributeError | RuntimeError) and not dropped_mid_command(e):
            raise
    await slot_map.refresh(reads_seen)
    return await call()


async def within(call: Awaitable[T], seconds: float | None) -> T:
    """``call``'s result, or TimeoutError (an OSError: the store's "did not answer in time") after ``seconds``."""
    return await call if seconds is None else await asyncio.wait_for(call, seconds)


async def ping(client: Client) -> bool:
    """PING every master of a cluster (a dead master without a replica makes its slots unserved), or the Redis."""
    if isinstance(client, RedisCluster):
        return bool(await client.execute_command("PING", target_nodes=RedisCluster.PRIMARIES))
    return bool(await client.ping())


async def append_waiting(client: Client, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int],
                         replicas: int, wait_ms: int) -> tuple[Any, int]:
    """The script's reply and how many replicas confirmed it (``WAIT replicas wait_ms`` on its connection). A
    node that lacks the script (a replica promoted since it was loaded) gets it loaded, and the call is sent again
    (NOSCRIPT means it did not run)."""
    target: dict[str, Any] = {}
    if isinstance(client, RedisCluster):
        target["target_nodes"] = client.get_node_from_key(keys[0])
    try:
        return await _script_then_wait(client, script.sha, keys, args, replicas, wait_ms, target)
    except rex.NoScriptError:
        script.sha = await client.script_load(script.script)
    return await _script_then_wait(client, script.sha, keys, args, replicas, wait_ms, target)


async def _script_then_wait(client: Client, sha: str, keys: Sequence[str], args: Sequence[str | int], replicas: int,
                            wait_ms: int, target: dict[str, Any]) -> tuple[Any, int]:
    async with client.pipeline(transaction=False) as pipe:
        # a command, not pipe.evalsha: the cluster pipeline blocks that method, yet routes EVALSHA by its keys
        pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        pipe.execute_command("WAIT", replicas, wait_ms, **target)
        reply, confirmed = await pipe.execute()
    return reply, int(confirmed)
