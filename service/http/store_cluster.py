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
    restarted) without the caller noticing. Timeouts are not retried, so a hung Redis costs one timeout; a down
    one is refused at once. redis-py's default (3 retries with backoff) would be slower. The single Redis's pool
    blocks up to the timeout for a free connection instead of failing under bursts; a cluster's pools (one per
    node, ``pool_size`` each) refuse at once when full (a 503)."""
    retry = Retry(NoBackoff(), retries=1, supported_errors=(rex.ConnectionError,))
    node = cluster_node_url(url)
    if node is not None:
        return RedisCluster.from_url(node, max_connections=pool_size, socket_connect_timeout=timeout_s,
                                     socket_timeout=timeout_s, retry=retry)
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


def dropped_mid_command(error: AttributeError) -> bool:
    """An AttributeError raised inside redis-py's connection code: its asyncio cluster client (8.1) closes a
    connection that another request is still opening when a failover makes it re-read the slot map
    (``'NoneType' object has no attribute 'writelines'``). A lost connection, so a 503; any other is a bug."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.endswith("redis/asyncio/connection.py")


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
