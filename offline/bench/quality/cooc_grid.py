"""Validation recall@N of the co-occurrence source alone over its window and history decay.

    python -m offline.bench.quality.cooc_grid --data PREPARED --out docs/results/sources/ml-100k-cooc-grid

The table is built from training positions only and each validation target is looked for in the
source's top N for the training sequence before it (history excluded, as under `repeats: exclude`).
No retriever is involved and the test split plays no part: this is where `ranker.cooc.WINDOW` and
`ranker.cooc.DECAY` were chosen. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.atomic import atomic_write
from offline.data.prepared import load_prepared
from offline.tables import markdown_table
from ranker.cooc import LAST, CoocTable, cooc_top
from retriever.windows import padded_slices

WINDOWS = (1, 3, 5)
DECAYS = (0.3, 0.5, 0.7, 0.9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="prepared folder")
    p.add_argument("--out", type=Path, required=True, help="results path without suffix: writes OUT.json, OUT.md")
    p.add_argument("--depth", type=int, default=100, help="N")
    args = p.parse_args(argv)
    data = load_prepared(args.data)
    split = data.split()
    train = split.train
    recent = padded_slices(train.items, train.offsets[:-1], train.offsets[1:], LAST)
    exclude = [train.items[s:e] for s, e in zip(train.offsets[:-1], train.offsets[1:], strict=True)]
    rows = []
    for window in WINDOWS:
        for decay in DECAYS:
            table = CoocTable.build(train.offsets, train.items, data.n_items, window=window, decay=decay)
            hits = 0
            for lo in range(0, len(recent), 2048):
                ids, _ = cooc_top(table, recent[lo : lo + 2048], exclude[lo : lo + 2048], args.depth)
                hits += int((ids == split.valid_targets[lo : lo + 2048, None]).any(1).sum())
            rows.append({"window": window, "decay": decay, f"valid_recall@{args.depth}": round(hits / len(recent), 6)})
    command = f"python -m offline.bench.quality.cooc_grid --data {args.data} --out {args.out} --depth {args.depth}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"data": str(args.data), "depth": args.depth, "last": LAST, "command": command, "rows": rows}
    atomic_write(args.out.with_suffix(".json"), lambda f: f.write_text(json.dumps(record, indent=2) + "\n"))
    best = max(rows, key=lambda r: float(r[f"valid_recall@{args.depth}"]))
    text = markdown_table(["window", "decay", f"valid recall@{args.depth}"],
                           [[r["window"], r["decay"], f"{r[f'valid_recall@{args.depth}']:.4f}"
                             + (" (best)" if r is best else "")] for r in rows])
    text = (f"Co-occurrence source alone, validation only, {args.data}; the newest {LAST} history items. "
            f"Reproduce: `{command}`.\n\n{text}\n")
    atomic_write(args.out.with_suffix(".md"), lambda f: f.write_text(text))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
