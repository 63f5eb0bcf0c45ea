"""`seqrec prepare`: read a dataset and write the prepared folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from offline.cli.common import SEED, Subparsers
from offline.cli.temporal import add_protocol_arguments, protocol_from


def add_prepare_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    from offline.data.readers import READER_OPTIONS, READERS

    p = sub.add_parser(
        "prepare", parents=[common], help="read a dataset and write the prepared folder",
        description="Read a dataset, sort each user's interactions by time (stable: equal timestamps keep "
        "the file's order), filter, map ids and write DIR/{manifest.json,sequences.parquet,items.parquet}.",
    )
    p.add_argument("--dataset", required=True, choices=sorted(READERS), help="dataset format")
    p.add_argument("--path", type=Path, help="file or folder with the source files")
    p.add_argument("--out", type=Path, required=True, help="prepared folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--download", action="store_true",
                   help="MovieLens only: fetch the official GroupLens zip and verify its MD5")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where downloads go (default $SEQREC_CACHE or ~/.cache/seqrec)")
    f = p.add_argument_group("filters")
    f.add_argument("--min-user-interactions", type=int, default=3, help="drop users with fewer (>= 3)")
    f.add_argument("--k-core", type=int, default=None, help="iteratively keep users and items with >= K")
    f.add_argument("--min-rating", type=float, default=None, help="drop interactions rated below this")
    t = p.add_argument_group("csv / parquet columns")
    for option in READER_OPTIONS:  # declared once, with ReaderOptions
        t.add_argument(option.flag, type=None if option.kind is str else option.kind, default=option.default,
                       help=option.help)
    s = p.add_argument_group("synthetic")
    s.add_argument("--n-users", type=int)
    s.add_argument("--n-items", type=int)
    s.add_argument("--mean-length", type=float)
    s.add_argument("--seed", type=SEED)
    s.add_argument("--days", type=int, help="a clock with drift over this many days (docs/backtest.md); 0: none")
    add_protocol_arguments(p, refit=False)
    p.set_defaults(handler=_prepare)


def _prepare(args: argparse.Namespace) -> int:
    from offline.data.prepare import Filters, prepare_dataset
    from offline.data.readers import READER_OPTIONS, ReaderOptions
    from offline.data.readers.tabular import parse_sep

    synthetic = {
        name: getattr(args, name)
        for name in ("n_users", "n_items", "mean_length", "seed", "days")
        if getattr(args, name) is not None
    }
    flags = {option.name: getattr(args, option.name) for option in READER_OPTIONS}
    flags.update(time_col=args.time_col or None, sep=parse_sep(args.sep))  # '' and '\\t' as a shell passes them
    options = ReaderOptions(path=args.path, synthetic=synthetic, **flags)
    filters = Filters(args.min_user_interactions, args.k_core, args.min_rating)
    temporal = protocol_from(args)
    check = None if temporal is None else lambda sequences, stamped: temporal.split(sequences, stamped).record()
    manifest = prepare_dataset(args.dataset, args.out, options, filters, download=args.download,
                               cache_dir=args.cache_dir, overwrite=args.overwrite, check_split=check)
    print(
        f"prepared {manifest['source']}: {manifest['users']:,} users, {manifest['items']:,} items, "
        f"{manifest['interactions']:,} interactions -> {args.out}"
    )
    shares = manifest["repeat_targets"]
    print(f"repeat targets (already in the user's history): {shares['valid']:.1%} of validation, "
          f"{shares['test']:.1%} of test")
    if "split" in manifest:
        _print_split(manifest["split"])
    return 0


def _print_split(record: dict) -> None:
    """The temporal split's windows, as `seqrec prepare --protocol temporal` checked them (docs/temporal.md)."""
    print(f"temporal split (cuts {record['valid_cut']} / {record['test_cut']}): "
          f"{record['train_interactions']:,} training interactions before the validation cut")
    for name in ("valid", "test"):
        w = record[name]
        print(f"  {name}: {w['users']:,} warm users, {w['cold_users']:,} cold users (apart), "
              f"{w['window_interactions']:,} window interactions, {w['new_item_targets']:,} next-item targets "
              f"are new items")
