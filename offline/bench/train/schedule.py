"""The schedule comparison: per-epoch validation of training runs that differ in train.schedule.

    python -m offline.bench.train.schedule --run wsd=RUN_DIR --run cosine=RUN_DIR \
        [--reference docs/results/ml-100k/results.json --reference-model transformer --reference-seed 42] \
        --out docs/results/schedule/ml-100k --command "how the runs were made"

RUN_DIR is a `seqrec train` artifact folder (or a `seqrec bench` run folder): its manifest gives the
best epoch's validation and test figures, its history.jsonl the lr and validation NDCG@10 of each
epoch. The reference is a committed bench result (no per-epoch curve, only its best epoch). Writes
OUT/curves.json, OUT/README.md (the table, test beside validation) and OUT/curves.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from common.atomic import atomic_write
from offline.tables import markdown_table


def read_run(name: str, folder: Path) -> dict[str, Any]:
    manifest = json.loads((folder / "manifest.json").read_text())
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines() if line]
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    return {
        "name": name, "schedule": config.get("train", {}).get("schedule", name),
        "best_epoch": manifest["training"]["best_epoch"], "epochs_run": manifest["training"]["epochs_run"],
        "valid": manifest["metrics"]["valid"], "test": manifest["metrics"]["test"],
        "curve": [{"epoch": r["epoch"], "lr": r["lr"], "valid_ndcg@10": r.get("valid", {}).get("NDCG@10")}
                  for r in history],
    }


def read_reference(path: Path, model: str, seed: int, schedule: str) -> dict[str, Any]:
    runs = json.loads(path.read_text())["runs"]
    (run,) = [r for r in runs if r["model"] == model and r["seed"] == seed]
    return {"name": f"committed {model} (seed {seed}, {path})", "schedule": schedule,
            "best_epoch": run["best_epoch"], "epochs_run": run["epochs_run"], "valid": run["valid"],
            "test": run["test"], "curve": []}


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    figure = Figure(figsize=(9.0, 3.6), layout="constrained")
    ndcg, lr = figure.subplots(1, 2)
    for run in runs:
        if run["curve"]:
            epochs = [c["epoch"] for c in run["curve"]]
            ndcg.plot(epochs, [c["valid_ndcg@10"] for c in run["curve"]], label=run["name"])
            lr.plot(epochs, [c["lr"] for c in run["curve"]], label=run["name"])
    ndcg.set(xlabel="epoch", ylabel="validation NDCG@10", title="validation per epoch")
    lr.set(xlabel="epoch", ylabel="lr (last step of the epoch)", title="schedule")
    ndcg.legend()
    atomic_write(path, lambda p: figure.savefig(p, dpi=110, format="png"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, metavar="NAME=RUN_DIR")
    p.add_argument("--reference", type=Path, default=None)
    p.add_argument("--reference-model", default="transformer")
    p.add_argument("--reference-seed", type=int, default=42)
    p.add_argument("--reference-schedule", default="as committed", help="its config's schedule, for the table")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--command", default="", help="how the runs were made (written into the README)")
    args = p.parse_args(argv)
    runs = [read_run(name, Path(folder)) for name, _, folder in (item.partition("=") for item in args.run)]
    if args.reference is not None:
        runs.append(read_reference(args.reference, args.reference_model, args.reference_seed, args.reference_schedule))
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "curves.json", lambda f: f.write_text(json.dumps(
        {"command": args.command, "runs": runs}, indent=1) + "\n"))
    rows = [(r["name"], r["schedule"], r["best_epoch"], r["epochs_run"], f"{r['valid']['NDCG@10']:.4f}",
             f"{r['test']['NDCG@10']:.4f}", f"{r['valid']['HR@10']:.4f}", f"{r['test']['HR@10']:.4f}") for r in runs]
    table = markdown_table(("run", "schedule", "best epoch", "epochs run", "valid NDCG@10", "test NDCG@10",
                            "valid HR@10", "test HR@10"), rows)
    text = (f"# Schedule comparison\n\nChosen on validation only; test beside it for the record.\n\n{table}\n\n"
            f"Runs: {args.command}\n\nPer-epoch validation and lr: curves.json, curves.png.\n")
    atomic_write(args.out / "README.md", lambda f: f.write_text(text))
    plot(runs, args.out / "curves.png")


if __name__ == "__main__":
    main()
