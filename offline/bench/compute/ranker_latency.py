"""Time the serving path of one request: encode, retrieve N candidates, features, ranker scores.

    python -m offline.bench.compute.ranker_latency --artifact artifacts/ml-100k --data data/ml-100k --candidates 200

Requests are real test-split histories (the last max_len items), one at a time, on one CPU
thread by default. Prints the median and p99 of each stage in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, required=True, help="bundle with a ranker")
    parser.add_argument("--data", type=Path, required=True, help="prepared folder of the bundle")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from offline.data.prepared import load_prepared
    from ranker.artifact import load_ranker, unit_item_vectors
    from ranker.features import compute_features
    from retriever.artifact import load_artifact
    from retriever.index import search

    artifact = load_artifact(args.artifact)
    index = artifact.index
    assert index is not None  # load_artifact reads the index unless told not to
    ranked = load_ranker(args.artifact, artifact.manifest)
    if ranked is None:
        parser.error(f"{args.artifact} holds no ranker; run `seqrec train-ranker` first")
    data = load_prepared(args.data)
    inputs = data.split().inputs("test")
    tables = ranked.tables.torch()
    vectors = unit_item_vectors(artifact.model.item_vectors().detach())
    rng = np.random.default_rng(0)
    users = rng.choice(len(inputs), size=args.warmup + args.requests, replace=True)
    times: dict[str, list[float]] = {"encode": [], "search": [], "features": [], "ranker": [], "total": []}
    with torch.inference_mode():
        for i, user in enumerate(users):
            row = inputs.row(int(user))
            t0 = time.perf_counter()
            history = torch.from_numpy(row[-artifact.max_len :])[None, :]
            query = torch.nn.functional.normalize(artifact.model.user_vectors(history), dim=-1)
            t1 = time.perf_counter()
            scores, found = search(index, query.numpy(), args.candidates, exclude=[row - 1])
            t2 = time.perf_counter()
            batch = compute_features(tables, vectors, history, query, torch.from_numpy(found + 1),
                                     torch.from_numpy(scores))
            t3 = time.perf_counter()
            ranked.ranker.score(batch)
            t4 = time.perf_counter()
            if i >= args.warmup:
                for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0), strict=True):
                    times[key].append(1000 * value)
    report = {
        "artifact": str(args.artifact), "ranker": ranked.kind, "candidates": args.candidates,
        "requests": args.requests, "threads": args.threads,
        "ms": {k: {"median": round(float(np.median(v)), 3), "p99": round(float(np.percentile(v, 99)), 3)}
               for k, v in times.items()},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
