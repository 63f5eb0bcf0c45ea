"""`seqrec bench`: the benchmark command group (its parser lives with the benches)."""

from offline.bench.models import add_bench_parser

__all__ = ["add_bench_parser"]
