"""The `seqrec` command line, one module per command group:

    seqrec.py    the parser and `main` (logging, one-line errors, exit codes)
    common.py    what the groups share (--debug/--quiet, --threads, --ks, JSON output)
    data.py      prepare                     train.py     train, export, evaluate
    rank.py      mine, train-ranker          pipeline.py  pipeline, demo
    serve.py     serve                       bench.py     bench (the benchmarks' own parser)
    analyze.py   analyze
"""

from offline.cli.seqrec import build_parser, main

__all__ = ["build_parser", "main"]
