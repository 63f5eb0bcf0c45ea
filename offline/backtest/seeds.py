"""Backtests of one plan under several training seeds, side by side: per step, the seed means of each mode's
next-item NDCG@k and training seconds, warm's ratio of the means, and scratch's own seed spread (the noise floor a
warm/scratch ratio has to be read against).

    python -m offline.backtest.seeds OUT_SEED_42 OUT_SEED_123 OUT_SEED_2023 --out FOLDER

writes FOLDER/seeds.json and FOLDER/seeds.md; a folder without backtest.json (a run stopped early) counts with its
finished steps (OUT/steps/), and a step counts only where every folder has finished both its modes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import write_json
from common.errors import SeqrecError
from offline.backtest.choose import QUALITY, TIME
from offline.tables import markdown_table


def across_seeds(reports: list[dict[str, Any]], k: int = 10) -> dict[str, Any]:
    """The per-step table and the target on the seed means, from each seed's backtest.json."""
    n = f"NDCG@{k}"
    by = [{(r["step"], r["mode"]): r for r in report["steps"]} for report in reports]
    steps = sorted({step for one in by for step, mode in one if mode == "warm"} &
                   {step for one in by for step, mode in one if mode == "scratch"})
    rows = []
    for step in steps:
        if not all((step, "scratch") in one and (step, "warm") in one for one in by):
            continue
        warm_runs = [one[(step, "warm")] for one in by]
        if not all(str(w.get("trained", "")).startswith("warm") for w in warm_runs):
            continue  # step 1: warm serves scratch's first bundle
        scratch = np.array([one[(step, "scratch")]["nightly"][n] for one in by])
        warm = np.array([w["nightly"][n] for w in warm_runs])
        scratch_live = np.array([one[(step, "scratch")]["live"][n] for one in by])
        warm_live = np.array([w["live"][n] for w in warm_runs])
        s_time = np.array([one[(step, "scratch")]["train_seconds"] or 0.0 for one in by])
        w_time = np.array([w["train_seconds"] or 0.0 for w in warm_runs])
        ratio, time_ratio = _over(warm.mean(), scratch.mean()), _over(w_time.mean(), s_time.mean())
        rows.append({"step": step, "users": warm_runs[0]["users"], "scratch_ndcg": scratch.tolist(),
                     "warm_ndcg": warm.tolist(), "ndcg_ratio": ratio,
                     "live_ndcg_ratio": _over(warm_live.mean(), scratch_live.mean()),
                     "scratch_spread": _over(scratch.max() - scratch.min(), scratch.mean()),
                     "scratch_seconds": s_time.tolist(), "warm_seconds": w_time.tolist(), "time_ratio": time_ratio,
                     "met": ratio is not None and time_ratio is not None and ratio >= QUALITY and time_ratio <= TIME})
    return {"seeds": [r["plan"].get("train_seed") for r in reports], "steps": rows,
            "met": f"{sum(r['met'] for r in rows)} of {len(rows)} steps"}


def _over(a: float, b: float) -> float | None:
    return float(a / b) if b else None


def _read(folder: Path) -> dict[str, Any]:
    """A backtest's backtest.json, or (a run still going or stopped) its plan and finished steps."""
    if (folder / "backtest.json").is_file():
        return dict(json.loads((folder / "backtest.json").read_text()))
    if not (folder / "plan.json").is_file():
        raise SeqrecError(f"{folder}: no backtest.json and no plan.json: no backtest's folder")
    return {"plan": json.loads((folder / "plan.json").read_text()),
            "steps": [json.loads(p.read_text()) for p in sorted((folder / "steps").glob("*.json"))]}


def write_seeds(folders: list[Path], out: Path) -> str:
    reports = [_read(folder) for folder in folders]
    table = across_seeds(reports)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "seeds.json", {"folders": [str(f) for f in folders], **table})
    rows = [(r["step"] + 1, r["users"], " / ".join(f"{v:.4f}" for v in r["scratch_ndcg"]),
             " / ".join(f"{v:.4f}" for v in r["warm_ndcg"]), f"{r['ndcg_ratio']:.3f}", f"{r['scratch_spread']:.2f}",
             f"{r['live_ndcg_ratio']:.3f}", f"{r['time_ratio']:.3f}", "yes" if r["met"] else "no")
            for r in table["steps"]]
    text = "\n".join([
        f"# Warm start against scratch over training seeds "
        f"{', '.join('the config' + chr(39) + 's' if s is None else str(s) for s in table['seeds'])}", "",
        markdown_table(("step", "users", "scratch nightly NDCG@10 per seed", "warm nightly NDCG@10 per seed",
                        "warm / scratch (seed means)", "scratch spread (max - min) / mean",
                        "live NDCG@10 warm / scratch (seed means)", "training seconds warm / scratch (seed means)",
                        "target met"), rows), "",
        f"Warm-start target on the seed means (NDCG@10 >= {QUALITY} x scratch at <= {TIME:.0%} of its training "
        f"seconds): met on {table['met']} (steps every run finished; step 1 serves scratch's own bundle).", ""])
    (out / "seeds.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="backtests of one plan under several seeds, side by side")
    parser.add_argument("folders", type=Path, nargs="+", help="backtest --out folders, one per seed")
    parser.add_argument("--out", type=Path, required=True, help="folder for seeds.json and seeds.md")
    args = parser.parse_args(argv)
    try:
        print(write_seeds(args.folders, args.out))
    except SeqrecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
