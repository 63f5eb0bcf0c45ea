"""Two-stage NDCG@10 and the retriever's recall against the candidate depth, on validation only.

    python -m offline.bench.quality.depth --artifact BUNDLE --data PREPARED --out docs/results/depth-demo

Each depth runs `offline.jobs.evaluate.evaluate_bundle` (what `seqrec evaluate --candidates N` prints); the
ranker stays the one trained at its own depth, so rows past it show what a deeper request would serve,
measured here but never trained on. The test split plays no part: the default depth is chosen from
this table. Writes OUT/depth.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from offline.data.prepared import load_prepared
from offline.jobs.evaluate import evaluate_bundle
from offline.tables import markdown_table

DEPTHS = (50, 100, 200, 400)


def depth_rows(bundle: Path, data_path: Path, depths: tuple[int, ...]) -> list[dict[str, Any]]:
    data = load_prepared(data_path)
    rows = []
    for depth in depths:
        result = evaluate_bundle(bundle, data, depth=depth, splits=("valid",))
        rows.append({"candidates": depth, "ranker_depth": result["ranker_depth"],
                     "two_stage_ndcg@10": result["valid"]["NDCG@10"],
                     "retriever_ndcg@10": result.get("retriever", {}).get("valid", {}).get("NDCG@10"),
                     "retriever_recall": result[f"recall@{depth}"]["valid"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="bundle with its ranker")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the bundle was trained on")
    p.add_argument("--out", type=Path, required=True, help="folder for depth.{json,md}")
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="comma-separated candidate depths")
    args = p.parse_args(argv)
    depths = tuple(int(d) for d in args.depths.split(","))
    rows = depth_rows(args.artifact, args.data, depths)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"artifact": str(args.artifact), "data": str(args.data), "split": "valid", "rows": rows}
    (args.out / "depth.json").write_text(json.dumps(record, indent=2) + "\n")
    table = markdown_table(["candidates", "two-stage NDCG@10", "retriever NDCG@10", "retriever recall@candidates"],
                           [[r["candidates"], f"{r['two_stage_ndcg@10']:.4f}",
                             "" if r["retriever_ndcg@10"] is None else f"{r['retriever_ndcg@10']:.4f}",
                             f"{r['retriever_recall']:.4f}"] for r in rows])
    ranker_depth = rows[0]["ranker_depth"] if rows else None
    text = (f"Validation split, bundle {args.artifact}, ranker trained at {ranker_depth} candidates "
            f"(`python -m offline.bench.quality.depth --artifact {args.artifact} --data {args.data} "
            f"--out {args.out}`).\n\n"
            f"{table}\n")
    (args.out / "depth.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
