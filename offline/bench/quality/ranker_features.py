"""Ablation of the candidate sources and the extra ranker features: two-stage NDCG@10 per variant.

    python -m offline.bench.quality.ranker_features --artifact BUNDLE --data PREPARED --mined MINED \
        --out docs/results/sources/ml-100k-ablation

Each variant trains the bundle's ranker anew (`offline.jobs.rank.train_ranker`, the same code as
`seqrec train-ranker`) on the same mined retriever groups (``--mined``: mined once, reused), with its
candidate sources and extra features, and reads the two-stage metrics it records (validation and
test groups of the bundle's depth, the served order). The variant kept is the one with the best
validation NDCG@10; test is reported beside it, never used. The bundle's ranker is overwritten by
each variant in turn, then by the kept one. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common.atomic import atomic_write
from offline.data.prepared import load_prepared
from offline.jobs.rank import train_ranker
from offline.tables import markdown_table
from ranker.config import RankerConfig

COOC_SOURCE = ("retriever", "cooc")
SOURCE_SIGNALS = ("cooc_last10", "cooc_rank")  # the cooc source's own score and rank
# (name, sources, extra features): the base ranker, the second source alone, then features added in turn.
VARIANTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("retriever only, base features", ("retriever",), ()),
    ("retriever only, + all extra features", ("retriever",),
     ("cooc_last1", "cooc_last3", *SOURCE_SIGNALS, "popularity_trend")),
    ("+ cooc source, base features", COOC_SOURCE, ()),
    ("+ cooc source, + its score and rank", COOC_SOURCE, SOURCE_SIGNALS),
    ("+ cooc source, + score, rank, last 1/3", COOC_SOURCE, ("cooc_last1", "cooc_last3", *SOURCE_SIGNALS)),
    ("+ cooc source, + score, rank, popularity trend", COOC_SOURCE, (*SOURCE_SIGNALS, "popularity_trend")),
    ("+ cooc source, + all extra features", COOC_SOURCE,
     ("cooc_last1", "cooc_last3", *SOURCE_SIGNALS, "popularity_trend")),
)


def run_variant(bundle: Path, data_path: Path, mined: Path, kind: str, mining: str, depth: int, share: float,
                sources: tuple[str, ...], features: tuple[str, ...]) -> dict[str, Any]:
    config = RankerConfig(kind=kind, mining=mining, depth=depth, sources=sources, cooc_share=share,
                          features=features)
    manifest = train_ranker(bundle, load_prepared(data_path), config, mined_dir=mined)
    metrics = manifest.metrics
    recall = (manifest.sources or {}).get(f"recall@{depth}") or (manifest.mining or {}).get(f"recall@{depth}", {})
    return {"sources": list(sources), "features": list(features), "kind": manifest.kind,
            "valid_ndcg@10": metrics["valid"]["NDCG@10"], "test_ndcg@10": metrics["test"]["NDCG@10"],
            "valid_hr@10": metrics["valid"]["HR@10"], "test_hr@10": metrics["test"]["HR@10"],
            "valid_recall": recall.get("valid"), "test_recall": recall.get("test")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="bundle whose ranker is retrained per variant")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the bundle was trained on")
    p.add_argument("--mined", type=Path, required=True, help="mined groups to reuse (mined there on the first run)")
    p.add_argument("--out", type=Path, required=True, help="path of the results without suffix: OUT.json, OUT.md")
    p.add_argument("--kind", default="lgbm", choices=["lgbm", "mlp", "auto"])
    p.add_argument("--mining", default="direct", choices=["direct", "holdout"])
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--cooc-share", type=float, default=0.25)
    p.add_argument("--only", default="", help="comma-separated variant numbers (1-based) to run; default all")
    args = p.parse_args(argv)
    picked = [int(i) for i in args.only.split(",") if i] or list(range(1, len(VARIANTS) + 1))
    rows = []
    for number in picked:
        name, sources, features = VARIANTS[number - 1]
        row = run_variant(args.artifact, args.data, args.mined, args.kind, args.mining, args.depth, args.cooc_share,
                          sources, features)
        rows.append({"variant": number, "name": name, **row})
        print(f"{number} {name}: valid NDCG@10 {row['valid_ndcg@10']:.4f} test {row['test_ndcg@10']:.4f}", flush=True)
    best = max(rows, key=lambda r: r["valid_ndcg@10"])
    if best is not rows[-1]:  # leave the bundle with the kept ranker
        run_variant(args.artifact, args.data, args.mined, args.kind, args.mining, args.depth, args.cooc_share,
                    tuple(best["sources"]), tuple(best["features"]))
    command = (f"python -m offline.bench.quality.ranker_features --artifact {args.artifact} --data {args.data} "
               f"--mined {args.mined} --out {args.out} --kind {args.kind} --mining {args.mining} "
               f"--depth {args.depth} --cooc-share {args.cooc_share}" + (f" --only {args.only}" if args.only else ""))
    record = {"artifact": str(args.artifact), "data": str(args.data), "kind": args.kind, "mining": args.mining,
              "depth": args.depth, "cooc_share": args.cooc_share, "kept": best["variant"], "command": command,
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out.with_suffix(".json"), lambda f: f.write_text(json.dumps(record, indent=2) + "\n"))
    table = markdown_table(
        ["#", "variant", "extra features", "valid recall@N", "valid NDCG@10", "test recall@N", "test NDCG@10"],
        [[r["variant"], r["name"] + (" (kept: best valid)" if r is best else ""), ", ".join(r["features"]) or "-",
          f"{r['valid_recall']:.4f}", f"{r['valid_ndcg@10']:.4f}", f"{r['test_recall']:.4f}",
          f"{r['test_ndcg@10']:.4f}"] for r in rows])
    text = (f"Two-stage NDCG@10 per candidate-source and feature variant ({args.kind} ranker, {args.mining} mining, "
            f"N = {args.depth} candidates, cooc share {args.cooc_share}), {args.data}. Recall@N: the target among "
            f"the N candidates the ranker reranks (the union's where the cooc source is on). Reproduce: "
            f"`{command}`.\n\n{table}\n")
    atomic_write(args.out.with_suffix(".md"), lambda f: f.write_text(text))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
