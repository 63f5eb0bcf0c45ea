"""`seqrec analyze`: the HTML report on trained artifacts."""

from __future__ import annotations

import argparse
from pathlib import Path

from offline.cli.common import SEED, Subparsers, set_threads


def add_analyze_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "analyze", parents=[common], help="HTML report: embedding geometry, head/tail and length breakdowns, "
        "readable predictions, training curves",
        description="Analyse a trained artifact (and others to compare, trained on the same catalogue) on a "
        "prepared dataset. Writes OUT/report.html, a PNG per figure and OUT/report.json with every number.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="the artifact (bundle) to analyse")
    p.add_argument("--compare", type=Path, action="append", default=[], metavar="ARTIFACT",
                   help="another artifact to show side by side (repeatable)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the artifacts were trained on")
    p.add_argument("--out", type=Path, required=True, help="report folder (replaced as a whole)")
    p.add_argument("--k", type=int, default=10, help="neighbours for hubness (k-occurrence; default 10)")
    p.add_argument("--head-share", type=float, default=0.2,
                   help="head = the most popular items making up this share of training interactions (0.2)")
    p.add_argument("--length-edges", default=None,
                   help="history-length bucket upper bounds, e.g. 5,10,20,50 (default: quantile buckets)")
    p.add_argument("--length-buckets", type=int, default=5, help="quantile buckets when no --length-edges (5)")
    p.add_argument("--users", type=int, default=5, help="sample users for readable predictions (5)")
    p.add_argument("--user-ids", default=None, help="comma-separated user ids to show instead of a sample")
    p.add_argument("--tsne-items", type=int, default=2000, help="items in the t-SNE sample (2000)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the user and t-SNE samples")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.set_defaults(handler=_analyze)


def _analyze(args: argparse.Namespace) -> int:
    from offline.analysis.analyze import run_analyze

    set_threads(args.threads)
    return run_analyze(args)
