"""Train one config with each loss and print a markdown table (validation decides; test is reported).

    python -m offline.bench.train.compare_losses --config configs/beauty/transformer.yaml --data data/beauty \
        --out runs/losses

Each variant is a plain `seqrec train` run, so every row can be reproduced on its own with the
command this script prints. Runs already finished in --out are reused, not retrained.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from offline.tables import markdown_table
from retriever.artifact import MANIFEST, ArtifactError, read_manifest


def variants(n_uniform: int) -> dict[str, list[str]]:
    return {
        "InfoNCE, in-batch negatives": ["--loss.name", "infonce"],
        f"InfoNCE + logQ + {n_uniform} uniform negatives": [
            "--loss.name", "infonce", "--loss.logq", "true", "--loss.n_uniform", str(n_uniform)],
        f"sampled softmax, {n_uniform} uniform negatives": [
            "--loss.name", "sampled", "--loss.n_negatives", str(n_uniform)],
        "full softmax (cross-entropy over all items)": ["--loss.name", "full"],
    }


def _row(name: str, run: Path) -> list[str]:
    manifest = read_manifest(run)
    v, t, tr = manifest.metrics["valid"], manifest.metrics["test"], manifest.training
    if tr is None:
        raise ArtifactError(run / MANIFEST, "records no training summary; it was not written by `seqrec train`")
    return [name, f"{v['NDCG@10']:.4f}", f"{v['HR@10']:.4f}", f"{t['NDCG@10']:.4f}", f"{t['HR@10']:.4f}",
            str(tr["best_epoch"]), f"{tr['seconds_to_best']:.0f}", f"{tr['sequences_per_second']:.0f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--uniform", type=int, default=2048, help="uniform negatives (mixed and sampled)")
    parser.add_argument("--only", nargs="*", default=None, help="variant numbers to run (1-based)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="more overrides after --, e.g. -- --train.seed 1")
    args = parser.parse_args()
    extra = [a for a in args.extra if a != "--"]
    rows = []
    for number, (name, overrides) in enumerate(variants(args.uniform).items(), start=1):
        if args.only and str(number) not in args.only:
            continue
        out = args.out / f"loss{number}"
        command = [sys.executable, "-m", "offline.cli", "train", "--config", str(args.config), "--data",
                   str(args.data), "--out", str(out), *overrides, *extra]
        print("$", shlex.join(command), file=sys.stderr)
        if not (out / "manifest.json").exists():
            subprocess.run(command, check=True)
        rows.append((name, out))
    head = ["loss", "valid NDCG@10", "valid HR@10", "test NDCG@10", "test HR@10", "best epoch", "s to best", "seq/s"]
    print(markdown_table(head, [_row(name, run) for name, run in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
