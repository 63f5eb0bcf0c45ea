"""`seqrec recommend`: precomputed top-k lists for many users (`offline.jobs.recommend`)."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import SeqrecError
from common.folders import enclosing_seqrec_folder
from offline.cli.common import Subparsers, file_path, print_json, set_threads

if TYPE_CHECKING:
    from offline.data.prepared import PreparedDataset

log = logging.getLogger(__name__)


def add_recommend_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "recommend", parents=[common], help="precompute top-k lists for many users (Parquet, optionally Redis)",
        description="Answer every chosen user of a prepared folder with the code POST /recommend runs (same window, "
        "exclusions, candidate depth, ranker and repeat policy), the history being the user's whole sequence. "
        "Writes OUT as Parquet (user_id, rank, item_id, score) atomically, and with --redis-url each list as JSON "
        "under {prefix}recs:{user_id}.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="bundle folder (or an artifacts folder's current)")
    p.add_argument("--data", type=Path, required=True,
                   help="prepared folder whose users to answer (of the catalogue the bundle was trained on)")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", type=Path, help="file of external user ids, one per line")
    who.add_argument("--all", action="store_true", help="every user of --data")
    p.add_argument("--k", type=int, default=10, help="items per user")
    p.add_argument("--out", type=file_path, required=True, help="Parquet file to write")
    p.add_argument("--stage", choices=["auto", "retriever", "two-stage"], default="auto",
                   help="two-stage needs a ranker in the bundle; auto = two-stage when there is one")
    p.add_argument("--shard", default="0/1", help="I/N: only users whose id hashes to I mod N (CRC-32)")
    p.add_argument("--batch-size", type=int, default=256, help="users per forward pass")
    p.add_argument("--filters", default=None,
                   help='JSON conditions on catalogue columns, as in POST /recommend: \'{"year": {"gte": 1990}}\'')
    p.add_argument("--include-items", type=Path, default=None, help="file of allowed item ids, one per line")
    p.add_argument("--exclude-items", type=Path, default=None, help="file of item ids never to return")
    p.add_argument("--redis-url", default=None, help="also write each list to this Redis")
    p.add_argument("--redis-prefix", default="seqrec:", help="Redis key prefix (the service's SEQREC_REDIS_PREFIX)")
    p.add_argument("--ttl", type=int, default=None, help="seconds each Redis list lives (default: no expiry)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.set_defaults(handler=_recommend)


def _recommend(args: argparse.Namespace) -> int:
    _check_numbers(args)
    from offline.data.prepared import load_prepared
    from offline.jobs.recommend import BatchJob, parse_shard, run_batch, select_users
    from service.http.engine import set_threads as set_inference_threads
    from service.system.catalog import load_served
    from service.system.filters import eligible
    from service.system.loader import resolve_bundle

    shard = parse_shard(args.shard)
    set_threads(args.threads)
    if args.threads is not None:
        set_inference_threads(args.threads)
    _check_writable(args.out)
    if not args.artifact.exists():  # the service's message names its own flag, --artifacts
        raise SeqrecError(f"--artifact {args.artifact}: no such folder")
    bundle = load_served(resolve_bundle(args.artifact))  # with its catalogue journal, as the service serves it
    if args.stage == "two-stage" and bundle.ranker is None:
        raise SeqrecError(f"--stage two-stage: {args.artifact} has no ranker")
    allowed, unknown = eligible(bundle.filters, bundle.index_of, filters=_filters(args.filters),
                                include=_ids(args.include_items), exclude=_ids(args.exclude_items))
    data = load_prepared(args.data)
    _check_items(bundle.index_of, data)
    rows = select_users(data, args.users, shard)
    job = BatchJob(k=args.k, rerank=args.stage != "retriever", batch_size=args.batch_size, shard=shard,
                   allowed=allowed)
    summary = run_batch(bundle, data, rows, job, args.out, redis_url=args.redis_url, redis_prefix=args.redis_prefix,
                        ttl=args.ttl)
    print_json({**summary, "unknown_items": unknown})
    return 0


def _check_items(index_of: Mapping[str, int], data: PreparedDataset) -> None:
    """Refuse data that shares no item with the bundle (another catalogue: no history item was known and every user
    got the same popularity list, exit 0); warn about items it does not know, dropped from the histories as the
    service drops them (data prepared after training holds new items: the usual case for nightly lists)."""
    ids = [str(i) for i in data.item_ids[1:]]
    unknown = [i for i in ids if i not in index_of]
    if ids and len(unknown) == len(ids):
        raise SeqrecError(f"{data.path} shares no item id with the bundle's catalogue (e.g. {ids[0]!r} is not in "
                          "it): a bundle of another catalogue")
    if unknown:
        log.warning("%d of %s's %d item ids are not in the bundle's catalogue (e.g. %r): dropped from the "
                    "histories, as the service drops them", len(unknown), data.path, len(ids), unknown[0])


def _check_writable(out: Path) -> None:
    """Refuse, before any work, an --out inside a prepared dataset or a bundle (the file replaced one of theirs,
    breaking its checksums, or sat where `seqrec prepare --overwrite` deletes it), and one whose folder this
    process cannot write (pyarrow's error for it, without a file name, was an internal error once every list had
    been computed)."""
    above = enclosing_seqrec_folder(out)
    if above is not None:
        raise SeqrecError(f"--out {out} is inside {above[0]}, {above[1]}; write the lists outside it")
    folder = next(p for p in (out.absolute().parent, *out.absolute().parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=folder):  # what the job's own temporary file would meet
            pass
    except OSError as err:
        raise SeqrecError(f"--out {out}: cannot write into {folder}: {err.strerror}") from None


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("k", "batch_size"):
        if getattr(args, name) < 1:
            raise SeqrecError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.ttl is not None and args.ttl < 1:
        raise SeqrecError(f"--ttl must be >= 1 second, got {args.ttl}")
    if args.ttl is not None and args.redis_url is None:
        raise SeqrecError("--ttl needs --redis-url")


def _filters(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SeqrecError(f"--filters is not valid JSON: {err}") from None
    from pydantic import ValidationError

    from service.http.schemas import Filters

    try:  # the request's own schema, so the CLI takes exactly what POST /recommend takes
        return Filters.model_validate(value).conditions()
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in ("filters", *first["loc"]))
        raise SeqrecError(f"--filters: {where}: {first['msg']} ({err.error_count()} error(s))") from None


def _ids(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise SeqrecError(f"{path}: unreadable item id file: {err}") from None
