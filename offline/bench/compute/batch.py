"""`python -m offline.bench.compute.batch`: users per second of `seqrec recommend` (`offline.jobs.recommend`).

For one bundle and one prepared folder, each stage (two-stage when the bundle has a ranker, and the
retriever alone) is run twice side by side in one process:

    reference  the first ``--reference-users`` users one at a time (batch size 1: one request's work, the
               service answering an unbatched stream, without HTTP)
    batch      every user in batches of ``--batch-size`` (what `seqrec recommend --all` runs)

both end to end (histories, both stages, the Parquet file). The speed-up is the ratio of the two rates.
For a million users, point ``--data`` at a folder from ``seqrec prepare --dataset synthetic --n-users 1000000``
(the bundle maps its items by external id). Each run appends its rows (label, users, users/s,
peak RSS, the load average before and after, since other work may share the machine) to
``OUT/results.json`` and rewrites ``OUT/README.md`` from all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from offline.data.prepared import load_prepared
from offline.jobs.recommend import BatchJob, parse_shard, run_batch, select_users
from offline.tables import markdown_table
from service.http.engine import set_threads
from service.system.loader import load_bundle, resolve_bundle

HEAD = ["label", "stage", "users", "batch size", "users/s (wall)", "users per CPU second",
        "reference users per CPU second (batch 1)", "speed-up (CPU)", "seconds", "peak RSS MB", "load avg before/after"]


def measure(bundle_path: Path, data_path: Path, *, label: str, k: int, batch_size: int,
            reference_users: int, stages: list[str], shard: tuple[int, int] = (0, 1)) -> list[dict[str, Any]]:
    bundle = load_bundle(resolve_bundle(bundle_path))
    data = load_prepared(data_path, verify=False)
    rows = select_users(data, None, shard)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for stage in stages:
            rerank = stage == "two-stage"
            if rerank and bundle.ranker is None:
                continue
            before = os.getloadavg()[0]
            ref = run_batch(bundle, data, rows[:reference_users], BatchJob(k=k, rerank=rerank, batch_size=1),
                            Path(tmp) / "reference.parquet")
            full = run_batch(bundle, data, rows, BatchJob(k=k, rerank=rerank, batch_size=batch_size),
                             Path(tmp) / "all.parquet")
            out.append({"label": label, "stage": stage, "users": full["users"], "batch_size": batch_size,
                        "users_per_s": full["users_per_s"], "users_per_cpu_s": full["users_per_cpu_s"],
                        "reference_users": ref["users"], "reference_users_per_s": ref["users_per_s"],
                        "reference_users_per_cpu_s": ref["users_per_cpu_s"],
                        "speedup_cpu": round(full["users_per_cpu_s"] / ref["users_per_cpu_s"], 2),
                        "seconds": full["seconds"], "cpu_seconds": full["cpu_seconds"],
                        "shard": f"{shard[0]}/{shard[1]} of {data.n_users:,} users",
                        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                        "load_before": round(before, 1), "load_after": round(os.getloadavg()[0], 1),
                        "bundle": str(bundle_path), "data": str(data_path), "model_version": bundle.version,
                        "k": k, "threads": 1, "cpus": os.cpu_count(), "machine": platform.machine(),
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return out


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    file = out / "results.json"
    kept = json.loads(file.read_text()) if file.exists() else []
    replaced = {(r["label"], r["stage"]) for r in rows}
    kept = [r for r in kept if (r["label"], r["stage"]) not in replaced] + rows
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=2) + "\n")
    os.replace(tmp, file)
    table = markdown_table(HEAD, [[r["label"], r["stage"], f"{r['users']:,} ({r['shard']})", r["batch_size"],
                                   f"{r['users_per_s']:,.0f}", f"{r['users_per_cpu_s']:,.0f}",
                                   f"{r['reference_users_per_cpu_s']:,.0f}", f"{r['speedup_cpu']:.1f}x",
                                   r["seconds"], r["peak_rss_mb"],
                                   f"{r['load_before']} / {r['load_after']}"] for r in kept])
    text = ("# seqrec recommend: users per second\n\nWritten by `python -m offline.bench.compute.batch` (commands in "
            "`docs/results/batch/COMMANDS.md`); one thread (`--threads 1`, OMP_NUM_THREADS=1) on a 2-core machine "
            "shared with other engineers' jobs: the load average before and after each run says how busy it was. "
            "Users per CPU second (the process's CPU time) is what one free core would do; users/s (wall) is what "
            "this busy machine gave. The reference is the same code one user at a time (batch size 1), run just "
            "before, in the same process.\n\n" + table + "\n")
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m offline.bench.compute.batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--label", required=True, help="the row's name in the table (the dataset)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--reference-users", type=int, default=500)
    p.add_argument("--stages", default="two-stage,retriever")
    p.add_argument("--shard", default="0/1", help="I/N: only that shard of the users (as seqrec recommend --shard)")
    p.add_argument("--out", type=Path, default=Path("docs/results/batch"))
    args = p.parse_args(argv)
    set_threads(1)
    rows = measure(args.bundle, args.data, label=args.label, k=args.k, batch_size=args.batch_size,
                   reference_users=args.reference_users, stages=args.stages.split(","), shard=parse_shard(args.shard))
    write(args.out, rows)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
