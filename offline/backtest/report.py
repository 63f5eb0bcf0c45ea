"""A backtest's steps as OUT/backtest.json, a markdown table (OUT/backtest.md) and a plot (OUT/backtest.png)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import write_json
from offline.tables import markdown_table

log = logging.getLogger(__name__)

HEAD = ("step", "window start", "mode", "train s", "step s", "users", "events", "nightly HR@10", "nightly NDCG@10",
        "all-day nightly NDCG@10", "live NDCG@10", "live gain", "recall@10", "coverage", "new-item events",
        "HTTP lists (differ)")


def _row(r: dict[str, Any], k: int) -> tuple[Any, ...]:
    n = f"NDCG@{k}"
    return (r["step"] + 1, r["start"], r["mode"], f"{r['train_seconds'] or 0:.0f}", f"{r['seconds']['step']:.0f}",
            r["users"], r["events"], f"{r['nightly'][f'HR@{k}']:.4f}", f"{r['nightly'][n]:.4f}",
            f"{r['nightly_all'][n]:.4f}", f"{r['live'][n]:.4f}", f"{r['live_gain'][n]:+.4f}",
            f"{r[f'recall@{k}']:.4f}", f"{r['coverage']['nightly']:.3f}", f"{r['new_items']['event_share']:.3f}",
            f"{r['http']['lists']} ({r['http']['differ']})")


def warm_against_scratch(records: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Per step where both ran: warm's nightly and live NDCG@k, its in-step validation NDCG@k (the pipeline's
    leave-one-out over the training data) and its training seconds as ratios of scratch's (step 1 excluded when warm
    served scratch's own first bundle)."""
    by = {(r["step"], r["mode"]): r for r in records}
    out = []
    for (step, mode), warm in sorted(by.items()):
        scratch = by.get((step, "scratch"))
        if mode != "warm" or scratch is None or not str(warm.get("trained", "")).startswith("warm"):
            continue
        n = f"NDCG@{k}"
        out.append({"step": step, "ndcg_ratio": _over(warm["nightly"][n], scratch["nightly"][n]),
                    "live_ndcg_ratio": _over(warm["live"][n], scratch["live"][n]),
                    "valid_ndcg_ratio": _over((warm.get("valid") or {}).get(n, 0.0),
                                              (scratch.get("valid") or {}).get(n, 0.0)),
                    "time_ratio": _over(warm["train_seconds"] or 0.0, scratch["train_seconds"] or 0.0)})
    return out


def summary(records: list[dict[str, Any]], ratios: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Per mode, the means over steps; the warm-start target per step (NDCG@k >= 0.98 x scratch's at <= 30 % of its
    training seconds); the HTTP lists compared and differing over every step."""
    n = f"NDCG@{k}"
    modes: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in records}):
        rows = [r for r in records if r["mode"] == mode]
        modes[mode] = {"steps": len(rows),
                       **{f"mean_{part}_{n}": float(np.mean([r[part][n] for r in rows]))
                          for part in ("nightly", "nightly_all", "live")},
                       f"mean_live_gain_{n}": float(np.mean([r["live_gain"][n] for r in rows])),
                       "steps_live_ahead": sum(r["live_gain"][n] > 0 for r in rows),
                       "mean_train_seconds": float(np.mean([r["train_seconds"] or 0.0 for r in rows])),
                       "mean_step_seconds": float(np.mean([r["seconds"]["step"] for r in rows])),
                       "max_step_seconds": float(max(r["seconds"]["step"] for r in rows))}
    met = [r for r in ratios if r["ndcg_ratio"] is not None and r["time_ratio"] is not None
           and r["ndcg_ratio"] >= 0.98 and r["time_ratio"] <= 0.30]
    return {"modes": modes, "warm_target_met": f"{len(met)} of {len(ratios)} steps",
            "http": {"lists": sum(r["http"]["lists"] for r in records),
                     "differ": sum(r["http"]["differ"] for r in records)}}


def _over(a: float, b: float) -> float | None:
    return a / b if b else None


def write_report(records: list[dict[str, Any]], out: Path, plan: dict[str, Any], notes: list[str]) -> str:
    k = int(plan.get("k", 10))
    records = sorted(records, key=lambda r: (r["step"], r["mode"]))
    ratios = warm_against_scratch(records, k)
    totals = summary(records, ratios, k)
    choice = json.loads((out / "warm-choice.json").read_text()) if (out / "warm-choice.json").is_file() else None
    write_json(out / "backtest.json", {"plan": plan, "notes": notes, "summary": totals, "steps": records,
                                       "warm_vs_scratch": ratios, "warm_choice": choice})
    lines = ["# Backtest", "", *(f"- {note}" for note in notes), "",
             markdown_table(HEAD, [_row(r, k) for r in records])]
    if choice is not None:
        lines += ["", *_choice_lines(choice, k)]
    if ratios:
        lines += ["", "Warm start against scratch (warm / scratch):", "",
                  markdown_table(("step", f"nightly NDCG@{k}", f"live NDCG@{k}",
                                  f"in-step validation NDCG@{k} (leave-one-out)", "training seconds"),
                                 [(r["step"] + 1, _ratio(r["ndcg_ratio"]), _ratio(r["live_ndcg_ratio"]),
                                   _ratio(r["valid_ndcg_ratio"]), _ratio(r["time_ratio"])) for r in ratios]),
                  "", f"Warm-start target (NDCG@{k} >= 0.98 x scratch at <= 30 % of its training seconds): met on "
                  f"{totals['warm_target_met']}."]
    lines += ["", markdown_table(("mode", f"mean nightly NDCG@{k}", f"mean all-day nightly NDCG@{k}",
                                  f"mean live NDCG@{k}", "mean live gain", "steps live ahead", "mean train s",
                                  "mean step s", "max step s"),
                                 [(mode, *(f"{m[key]:.4f}" for key in (f"mean_nightly_NDCG@{k}",
                                                                        f"mean_nightly_all_NDCG@{k}",
                                                                        f"mean_live_NDCG@{k}",
                                                                        f"mean_live_gain_NDCG@{k}")),
                                   f"{m['steps_live_ahead']} of {m['steps']}", f"{m['mean_train_seconds']:.0f}",
                                   f"{m['mean_step_seconds']:.0f}", f"{m['max_step_seconds']:.0f}")
                                  for mode, m in totals["modes"].items()]),
              "", f"HTTP parity: {totals['http']['differ']} of {totals['http']['lists']} sampled lists differ."]
    text = "\n".join(lines) + "\n"
    (out / "backtest.md").write_text(text)
    _plot(records, out / "backtest.png", k)
    return text


def _choice_lines(choice: dict[str, Any], k: int) -> list[str]:
    """The warm-start schedule chosen on the validation window (offline/backtest/choose.py) and its evidence."""
    start, end = choice["valid_window"]
    scratch = choice["scratch"]
    rows = [("scratch", "", f"{scratch['ndcg']:.4f}", f"{scratch['live_ndcg']:.4f}", f"{scratch['train_seconds']:.0f}",
             "1.000", "1.000")]
    for j, c in enumerate(choice["candidates"]):
        o = c["overrides"]
        rows.append((f"warm {j}{' (chosen)' if j == choice['chosen'] else ''}",
                     f"epochs {o['train.epochs']}, patience {o['train.patience']}, lr {o['train.lr']:.4g}",
                     f"{c['ndcg']:.4f}", f"{c['live_ndcg']:.4f}", f"{c['train_seconds']:.0f}",
                     _ratio(_over(c["ndcg"], scratch["ndcg"])),
                     _ratio(_over(c["train_seconds"], scratch["train_seconds"]))))
    return [f"Warm-start schedule chosen on the validation window {start} .. {end} ({scratch['users']} users, "
            f"{scratch['events']} events; warm candidates start from scratch trained before "
            f"{choice['base_trained_before']}). Rule: {choice['rule']}. Chosen: {choice['why']}.", "",
            markdown_table(("run", "warm-start overrides (warm-up 0)", f"valid nightly NDCG@{k}",
                            f"valid live NDCG@{k}", "train s", "NDCG / scratch", "time / scratch"), rows)]


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _plot(records: list[dict[str, Any]], path: Path, k: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot (%s); the table and the JSON hold every figure", path)
        return
    fig, (quality, cost) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in sorted({r["mode"] for r in records}):
        rows = [r for r in records if r["mode"] == mode]
        steps = [r["step"] + 1 for r in rows]
        quality.plot(steps, [r["nightly_all"][f"NDCG@{k}"] for r in rows], marker="o", label=f"{mode}: nightly")
        quality.plot(steps, [r["live"][f"NDCG@{k}"] for r in rows], marker="s", linestyle="--", label=f"{mode}: live")
        cost.plot(steps, [r["train_seconds"] or 0 for r in rows], marker="o", label=mode)
    quality.set(xlabel="step", ylabel=f"NDCG@{k}, every window event",
                title="the list before each event: nightly or live")
    cost.set(xlabel="step", ylabel="training seconds", title="training cost")
    quality.legend(fontsize=8)
    cost.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
