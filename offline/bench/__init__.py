"""Benchmarks, each run through `seqrec bench ...` or `python -m offline.bench.<group>.<name>`, grouped by what they
measure: serve/ (the service as a running process under load), compute/ (the model's work in one process), quality/
(what the recommendations are worth), train/ (training recipes), faults/ (faults under load), and lib/ (the load
client, server processes, request bodies, measurement and rate sweeps they share)."""
