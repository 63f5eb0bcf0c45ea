"""Benchmarks, each run through `seqrec bench ...` or `python -m offline.bench.<name>`."""
