"""`python -m offline.bench.train.warm_start`: nightly retraining from yesterday's model against from scratch.

    prefix  OUT = each user's first SHARE of their training positions (then the same validation and test
            items): the data as it stood "yesterday" (offline/data/derive.py)
    report  compare a warm-started run (``seqrec train --init-from YESTERDAY``) with a from-scratch run on the
            same (all) data: validation NDCG@10 of each one's best epoch, training seconds and epochs to it and
            in all, and the seconds and epochs from scratch needed to first reach the warm start's best

A run is an artifact folder (its ``history.jsonl``) or, for a run stopped before it finished, a training
output folder (``run/history.jsonl``): every figure comes from the per-epoch records, whose seconds count
training only (validation excluded) and whose epochs are the same work whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.data.derive import time_prefix
from offline.data.prepared import load_prepared
from offline.tables import markdown_table

METRIC = "NDCG@10"


def prefix_main(args: argparse.Namespace) -> int:
    manifest = time_prefix(load_prepared(args.data), Path(args.out), args.share)
    print(json.dumps({k: manifest[k] for k in ("users", "items", "interactions")}))
    return 0


def curve(run: Path) -> list[dict[str, Any]]:
    for file in (run / "history.jsonl", run / "run" / "history.jsonl"):
        if file.is_file():
            return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    raise SeqrecError(f"{run}: no history.jsonl (an artifact) nor run/history.jsonl (a training folder)")


def summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [h for h in history if "valid" in h]
    if not scored:
        raise SeqrecError("no validated epoch in the run")
    best = max(scored, key=lambda h: (h["valid"][METRIC], -h["epoch"]))  # the first epoch of the best score
    seconds = [h["epoch_seconds"] for h in history]
    return {"best_epoch": best["epoch"], "valid_ndcg@10": best["valid"][METRIC], "epochs_run": len(history),
            "seconds_to_best": round(sum(seconds[: best["epoch"]]), 1), "seconds": round(sum(seconds), 1),
            "finished": False}


def first_reaching(history: list[dict[str, Any]], value: float) -> dict[str, Any] | None:
    seconds = 0.0
    for h in history:
        seconds += h["epoch_seconds"]
        if "valid" in h and h["valid"][METRIC] >= value:
            return {"epoch": h["epoch"], "seconds": round(seconds, 1)}
    return None


def report_main(args: argparse.Namespace) -> int:
    runs = {"from scratch (all data)": Path(args.scratch), "warm start (all data)": Path(args.warm)}
    if args.yesterday:
        runs = {"yesterday (prefix data)": Path(args.yesterday), **runs}
    histories = {name: curve(path) for name, path in runs.items()}
    record: dict[str, Any] = {"command": shlex.join(["python", "-m", "offline.bench.train.warm_start", *sys.argv[1:]]),
                              "runs": {}}
    for name, path in runs.items():
        record["runs"][name] = {"path": str(path), **summary(histories[name]),
                                "finished": (path / "manifest.json").is_file()}
    scratch, warm = histories["from scratch (all data)"], record["runs"]["warm start (all data)"]
    reached = first_reaching(scratch, warm["valid_ndcg@10"])
    record["scratch_to_reach_warm_best"] = reached
    record["warm_seconds_share_of_scratch_to_reach_it"] = (
        None if reached is None else round(warm["seconds"] / reached["seconds"], 3))
    record["notes"] = args.note or []
    rows = [[name, r["valid_ndcg@10"], r["best_epoch"], r["epochs_run"], r["seconds_to_best"], r["seconds"],
             "yes" if r["finished"] else "no (stopped)"] for name, r in record["runs"].items()]
    table = markdown_table(["run", "valid NDCG@10 (best)", "best epoch", "epochs", "seconds to best",
                            "seconds in all", "early-stopped/finished"], rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))
    line = ("from scratch never reached the warm start's best validation" if reached is None else
            f"from scratch first reached the warm start's best validation ({warm['valid_ndcg@10']:.4f}) at epoch "
            f"{reached['epoch']} after {reached['seconds']:.0f} s of training; the warm start took "
            f"{warm['seconds']:.0f} s in all ({record['warm_seconds_share_of_scratch_to_reach_it']:.0%})")
    notes = "".join(f"\n- {n}" for n in record["notes"])
    text = f"# Warm start\n\n{table}\n\n{line}.{notes}\n\nReproduce: `{record['command']}`\n"
    atomic_write(out / "results.md", lambda p: p.write_text(text))
    print(text)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m offline.bench.train.warm_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("prefix", help="each user's first share of their training positions")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--share", type=float, default=0.9)
    s.set_defaults(handler=prefix_main)
    r = sub.add_parser("report", help="compare a warm start with from scratch")
    r.add_argument("--scratch", required=True, help="from-scratch run on all the data")
    r.add_argument("--warm", required=True, help="warm-started run on all the data")
    r.add_argument("--yesterday", default=None, help="the run on the prefix data it started from")
    r.add_argument("--out", required=True)
    r.add_argument("--note", action="append", help="a line for the results (what else ran, what was stopped)")
    r.set_defaults(handler=report_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SeqrecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
