"""`seqrec recommend`: precomputed lists for many users, through the code the service answers with.

Each user's history is their whole prepared sequence ("what next, after everything we know"), mapped to
the bundle's ids by external id (items the bundle does not know are dropped, as the service drops them; the
CLI warns about them and refuses data that shares no item with the bundle).
Users stream in batches through `service.system.query.plan_query` (the window, the exclusions, the default
depth) and `service.system.recommend.recommend_batch` (FAISS, the ranker's features and scores), the functions
behind ``POST /recommend``; a history with no known item gets the service's popularity answer. Business
filters (`service.system.filters`) apply as in a request.

Output: a Parquet file (``user_id, rank, item_id, score``, one row group per batch) written to a temporary
file and renamed, and optionally each user's list in Redis under ``{prefix}recs:{user_id}`` as JSON
``{"model_version", "items": [{"item_id", "score"}, ...]}`` (best first), with a TTL.

``--shard I/N`` keeps the users whose external id hashes (CRC-32 of its UTF-8 bytes) to I mod N, so N copies
of the job cover every user once; their outputs together hold exactly the unsharded output's rows.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis
from tqdm import tqdm

from common.errors import SeqrecError
from common.redis_url import check_redis_url, redact_url
from offline.data.prepared import PreparedDataset
from offline.jobs.tables import has_clock
from service.system.bundle import Bundle
from service.system.query import plan_query, popular
from service.system.recommend import Query, recommend_batch

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("user_id", pa.string()), ("rank", pa.int32()), ("item_id", pa.string()),
                    ("score", pa.float64())])
RECS_KEY = "{prefix}recs:{user_id}"


@dataclass(frozen=True)
class BatchJob:
    k: int = 10
    rerank: bool = True  # False: the retriever's top k (--stage retriever)
    batch_size: int = 256
    shard: tuple[int, int] = (0, 1)  # (I, N)
    allowed: np.ndarray | None = None  # business filters: the eligible index rows (service.system.filters.eligible)


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise SeqrecError(f"--shard must look like I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SeqrecError(f"--shard {text}: needs 0 <= I < N")
    return i, n


def shard_of(user_id: str, n: int) -> int:
    """The shard of ``user_id`` among ``n``: stable across runs, machines and Python versions."""
    return zlib.crc32(user_id.encode("utf-8")) % n


def select_users(data: PreparedDataset, users_file: Path | None, shard: tuple[int, int]) -> np.ndarray:
    """Rows of ``data``'s users to answer, in file order (or data order for all users), in ``shard`` only."""
    if users_file is None:
        rows = np.arange(data.n_users)
    else:
        try:
            wanted = [line.strip() for line in users_file.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as err:
            raise SeqrecError(f"{users_file}: unreadable users file: {err}") from None
        row_of = {str(u): r for r, u in enumerate(data.user_ids.tolist())}
        missing = [u for u in wanted if u not in row_of]
        if missing:
            raise SeqrecError(f"{users_file}: {len(missing)} user ids are not in {data.path} (first: {missing[0]!r})")
        rows = np.array(list(dict.fromkeys(row_of[u] for u in wanted)), dtype=np.int64)
    i, n = shard
    if n > 1:
        rows = rows[[shard_of(str(data.user_ids[r]), n) == i for r in rows]]
    return rows


def bundle_ids(bundle: Bundle, data: PreparedDataset) -> np.ndarray:
    """(data.n_items + 1,) the bundle's internal id of each of the data's internal ids (0 = unknown)."""
    return np.array([0, *(bundle.index_of.get(str(i), 0) for i in data.item_ids[1:].tolist())], dtype=np.int64)


def recommend_users(bundle: Bundle, data: PreparedDataset, rows: np.ndarray,
                    job: BatchJob) -> Iterator[tuple[int, pa.Table]]:
    """(users, table of ``SCHEMA``) per batch of users, in the order of ``rows``."""
    to_bundle = bundle_ids(bundle, data)
    offsets, items = data.sequences.offsets, data.sequences.items
    times = data.sequences.timestamps if has_clock(data) else None  # positions are no times
    for lo in range(0, len(rows), job.batch_size):
        batch = rows[lo : lo + job.batch_size]
        histories = [(h := to_bundle[items[offsets[u] : offsets[u + 1]]])[h > 0].tolist() for u in batch]
        newest = [None if times is None or offsets[u + 1] == offsets[u] else float(times[offsets[u + 1] - 1])
                  for u in batch]
        queries = _queries(bundle, histories, job, newest)
        planned = [q for q in queries if q is not None]
        answered = iter(recommend_batch(bundle, planned) if planned else [])
        lists = [_popular_list(bundle, h, job) if q is None else _scored(next(answered).items)
                 for q, h in zip(queries, histories, strict=True)]
        yield len(batch), _table(bundle, [str(data.user_ids[u]) for u in batch], lists)


def _scored(items: list[tuple[int, float, float]]) -> list[tuple[int, float]]:
    return [(i, score) for i, score, _ in items]


def _popular_list(bundle: Bundle, history: list[int], job: BatchJob) -> list[tuple[int, float]]:
    seen = set(history) if bundle.exclude_seen else set()
    return [(i, float(bundle.popularity[i])) for i in popular(bundle, job.k, seen, job.allowed)]


def _table(bundle: Bundle, users: list[str], lists: list[list[tuple[int, float]]]) -> pa.Table:
    lengths = [len(items) for items in lists]
    flat = [pair for items in lists for pair in items]
    item_ids = np.asarray(bundle.artifact.item_ids).astype(str)
    internal = np.array([i for i, _ in flat], dtype=np.int64)
    ranks = np.concatenate([np.arange(1, n + 1) for n in lengths] or [np.empty(0, dtype=np.int64)])
    return pa.table({
        "user_id": pa.array(np.repeat(np.array(users, dtype=object), lengths), pa.string()),
        "rank": pa.array(ranks.astype(np.int32)),
        "item_id": pa.array(item_ids[internal - 1] if len(internal) else [], pa.string()),
        "score": pa.array([s for _, s in flat], pa.float64()),
    }, schema=SCHEMA)


def run_batch(bundle: Bundle, data: PreparedDataset, rows: np.ndarray, job: BatchJob, out: Path, *,
              redis_url: str | None = None, redis_prefix: str = "seqrec:", ttl: int | None = None) -> dict[str, Any]:
    """Answer ``rows``' users, write ``out`` atomically (and Redis); returns a summary with users/s."""
    if out.is_dir():  # checked before the work: the final rename would fail only after every user was answered
        raise SeqrecError(f"{out}: a folder; --out names the Parquet file to write (e.g. {out / 'recs.parquet'})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    client = _redis(redis_url) if redis_url else None
    started, cpu = time.perf_counter(), time.process_time()
    n_rows = stored = 0
    try:
        with pq.ParquetWriter(tmp, SCHEMA) as writer, tqdm(total=len(rows), desc="recommend", unit="user",
                                                           disable=None) as bar:
            for n_users, table in recommend_users(bundle, data, rows, job):
                writer.write_table(table)
                if client is not None:
                    try:
                        _write_redis(client, table, bundle.version, redis_prefix, ttl)
                    except redis.RedisError as err:  # full, gone, read-only replica: the user's to fix
                        raise SeqrecError(f"--redis-url {redact_url(redis_url or '')}: Redis refused the lists: "
                                          f"{_reason(err)} (earlier batches stored the lists of {stored} users; "
                                          f"{out} was not written)") from None
                    stored += n_users
                n_rows += table.num_rows
                bar.update(n_users)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        if client is not None:
            client.close()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    # CPU seconds too: on a shared machine the wall rate says how busy it was, the CPU rate what one core does
    return {"out": str(out), "users": len(rows), "rows": n_rows, "seconds": round(seconds, 3),
            "users_per_s": round(len(rows) / seconds, 1) if seconds > 0 else None,
            "cpu_seconds": round(cpu_seconds, 3),
            "users_per_cpu_s": round(len(rows) / cpu_seconds, 1) if cpu_seconds > 0 else None,
            "model_version": bundle.version, "shard": f"{job.shard[0]}/{job.shard[1]}", "redis": bool(client)}


def _redis(url: str) -> Any:
    try:
        check_redis_url(url)  # a database that is no number ('/abc') was database 0, exit 0
    except ValueError as err:
        raise SeqrecError(f"--redis-url {redact_url(url)}: {err}") from None
    try:
        client = redis.Redis.from_url(url, socket_timeout=10.0)
        client.ping()
    except (redis.RedisError, ValueError) as err:
        raise SeqrecError(f"--redis-url {redact_url(url)}: cannot reach Redis: {err}") from None
    return client


def _reason(err: redis.RedisError) -> str:
    """The server's reason without the command: a pipeline's error quotes the whole SET, list included."""
    text = str(err)
    return f"{type(err).__name__}: {text.split('caused error: ', 1)[-1]}"


def _write_redis(client: Any, table: pa.Table, version: str, prefix: str, ttl: int | None) -> None:
    """Each user's list as one JSON value, in one pipeline per batch."""
    lists: dict[str, list[dict[str, Any]]] = {}
    for user, item, score in zip(*(table.column(c).to_pylist() for c in ("user_id", "item_id", "score")),
                                 strict=True):
        lists.setdefault(user, []).append({"item_id": item, "score": score})
    with client.pipeline(transaction=False) as pipe:
        for user, items in lists.items():
            pipe.set(RECS_KEY.format(prefix=prefix, user_id=user),
                     json.dumps({"model_version": version, "items": items}), ex=ttl)
        pipe.execute()


def _queries(bundle: Bundle, histories: list[list[int]], job: BatchJob,
             newest: list[float | None]) -> list[Query | None]:
    """What `service.http.answer` would queue for each history sent as a request with its items' timestamps (None: the
    popularity answer); a ranker with request-time features scores as of the clock when it runs."""
    return [plan_query(bundle, h, set(), k=job.k, candidates=None, exclude_seen=bundle.exclude_seen,
                       rerank=job.rerank, allowed=job.allowed, last_event=t) for h, t in zip(histories, newest,
                                                                                          strict=True)]
