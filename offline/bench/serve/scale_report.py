"""The report of `seqrec bench scale`: log-log slopes, one PNG per curve, scale.{json,md}.

Rewritten after every measured point (``refresh``), so a long run shows its progress.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import atomic_write
from offline.bench.lib.measure import fit_alpha
from offline.tables import markdown_table

MB = 2**20
TABLE_COPIES = 4  # weights, gradients, Adam's two moments
Panel = tuple[str, Sequence[tuple[str, str]]]  # y label, (point key, legend) per line
# curve -> x key, x label, PNG, title, panels; every plotted key gets a log-log slope against x
CURVES: dict[str, tuple[str, str, str, str, Sequence[Panel]]] = {
    "train": ("interactions", "interactions", "train_time.png", "One training epoch against interactions", [
        ("seconds per epoch", [("epoch_seconds", "training pass")]), ("MB", [("peak_rss_mb", "training peak RSS")])]),
    "serve": ("n_items", "catalogue items", "serve_p99.png", "Serving latency against catalogue size", [
        ("ms", [("p50_ms", "p50"), ("p99_ms", "p99")]),
        ("MB", [("server_rss_mb", "server RSS after the load"), ("bundle_mb", "bundle on disk")])]),
    "memory": ("n_items", "catalogue items", "memory.png", "Memory against catalogue size", [
        ("MB", [("peak_rss_mb", "training peak RSS"), ("server_rss_mb", "server RSS")]),
        ("MB above the smallest catalogue", [("extra_mb", "training peak RSS"),
                                             ("expected_extra_mb", "expected: item tables x 4")])]),
}


def slopes(points: Sequence[dict[str, Any]], x: str, ys: Sequence[str]) -> dict[str, float | None]:
    """Log-log slope of each ``y`` against ``x`` over the points where both are positive (None below two)."""
    out: dict[str, float | None] = {}
    for y in ys:
        pairs = [(p[x], p[y]) for p in points if (p.get(y) or 0) > 0 and p[x] > 0]
        out[y] = round(fit_alpha([a for a, _ in pairs], [b for _, b in pairs]), 3) if len(pairs) >= 2 else None
    return out


def plot_curve(path: Path, name: str, curve: dict[str, Any]) -> None:
    """One log-log panel per y label of CURVES[name]; each line labelled with its fitted slope."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    x, xlabel, _, title, panels = CURVES[name]
    figure = Figure(figsize=(5.5 * len(panels), 4.2), layout="constrained")
    for axes, (ylabel, lines) in zip(np.atleast_1d(figure.subplots(1, len(panels))), panels, strict=True):
        for key, label in lines:
            shown = [p for p in curve["points"] if (p.get(key) or 0) > 0]
            alpha = curve["slopes"].get(key)
            if shown:
                axes.loglog([p[x] for p in shown], [p[key] for p in shown], marker="o",
                            label=label + ("" if alpha is None else f" (slope {alpha:.2f})"))
        axes.set(xlabel=xlabel, ylabel=ylabel)
        axes.grid(True, which="both", alpha=0.3)
        if axes.has_data():
            axes.legend()
    figure.suptitle(title)
    figure.savefig(path, dpi=120, format="png")  # path may be a temp name


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _train_section(points: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    rows = [[f"{p['interactions']:,}", f"{p['users']:,}", f"{p['items_seen']:,}", p["steps"],
             f"{p['epoch_seconds']:.2f}", f"{p['sequences_per_second']:,.0f}", _mb(p["peak_rss_mb"]),
             _mb(p["rss_before_fit_mb"]), f"{p['valid_sample'].get('NDCG@10', float('nan')):.4f}"] for p in points]
    return ["## Training time against interactions",
            f"Exactly one epoch on synthetic data (mean length {s['mean_length']:g}) over a fixed catalogue of "
            f"{s['train_items']:,} items (items seen: those the data holds), CPU, {s['threads']} thread(s). "
            f"s / epoch: the training pass alone (history `epoch_seconds`); validation followed it on "
            f"{s['valid_users']} fixed users.",
            markdown_table(["interactions", "users", "items seen", "steps", "s / epoch", "seq / s", "peak RSS MB",
                    "RSS before fit MB", "valid NDCG@10 (sample)"], rows)]


def _serve_section(points: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    rows = [[f"{p['n_items']:,}", p["index"]["kind"], f"{p['bundle_seconds']:.1f}", f"{p['bundle_mb']:,.1f}",
             f"{p['p50_ms']:.2f}", f"{p['p99_ms']:.2f}", f"{p['ok']}/{p['sent']}", p["errors"],
             _mb(p["server_rss_ready_mb"]), _mb(p["server_rss_mb"])] for p in points]
    return ["## Serving latency against catalogue size",
            f"Open-loop Poisson load at {s['rate']:g} r/s for {s['duration']:g} s after {s['warmup']:g} s of "
            f"warm-up; histories of {s['min_len']}-{s['max_len']} random catalogue items, k=10, retrieval only "
            f"(the bundles hold no ranker); one uvicorn process, {s['threads']} torch thread(s); randomly "
            "initialised weights. bundle s: writing the bundle, index build included.",
            markdown_table(["items", "index", "bundle s", "bundle MB", "p50 ms", "p99 ms", "ok / sent", "errors",
                    "server RSS ready MB", "server RSS after MB"], rows)]


def _memory_section(points: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    rows = [[f"{p['n_items']:,}", p["steps"], f"{p['expected_tables_mb']:,.1f}", _mb(p["peak_rss_mb"]),
             _mb(p["extra_mb"]), f"{p['expected_extra_mb']:,.1f}", _mb(p["full_logits_mb"]),
             _mb(p.get("server_rss_mb"))] for p in points]
    return ["## Memory against catalogue size",
            f"Training: the same data (about {s['memory_steps']} steps of the config's batch) at every catalogue "
            f"size, one epoch. Item tables: {TABLE_COPIES} x (n_items + 1) x d x 4 bytes (weights, gradients, two "
            "Adam moments); above the smallest: the growth from the first row, measured and expected. Full "
            "logits: one (batch positions x n_items) float32 tensor, which this loss never builds.",
            markdown_table(["items", "steps", "item tables MB", "training peak RSS MB", "above smallest MB",
                    "expected above smallest MB", "full logits MB", "server RSS MB"], rows)]


SECTIONS = {"train": _train_section, "serve": _serve_section, "memory": _memory_section}


def scale_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Scaling curves ({report['config']})"]
    for name, section in SECTIONS.items():
        if name not in report:
            continue
        curve, against = report[name], CURVES[name][1]
        fitted = ", ".join(f"{key} {value:.2f}" for key, value in curve["slopes"].items() if value is not None)
        lines += [*section(curve["points"], report["settings"]), f"Log-log slopes against {against}: {fitted or '—'}.",
                  *([f"**Stopped** {curve['error']}"] if "error" in curve else []), f"![{name}]({CURVES[name][2]})"]
    machine = report["machine"]
    notes = [*report["notes"], f"{machine['cpus']} CPUs; load average {machine['load_start']} at the start, "
             f"{machine['load_end']} at the end; {report['seconds']:.0f} s in all."]
    lines += ["## Notes", "\n".join(f"- {n}" for n in notes), f"Reproduce: `{report['command']}`"]
    return "\n\n".join(lines) + "\n"


def refresh(out: Path, report: dict[str, Any], name: str) -> None:
    """Derived columns and slopes, then scale.{json,md} and curve ``name``'s PNG; rerun after every point."""
    memory = report.get("memory", {}).get("points", [])
    for point in memory:
        point["extra_mb"] = round(point["peak_rss_mb"] - memory[0]["peak_rss_mb"], 1)
        point["expected_extra_mb"] = round(point["expected_tables_mb"] - memory[0]["expected_tables_mb"], 2)
    x, *_, panels = CURVES[name]
    report[name]["slopes"] = slopes(report[name]["points"], x, [key for _, lines in panels for key, _ in lines])
    report["machine"]["load_end"] = [round(v, 2) for v in os.getloadavg()]
    atomic_write(out / "scale.json", lambda p: p.write_text(json.dumps(report, indent=2) + "\n"))
    atomic_write(out / "scale.md", lambda p: p.write_text(scale_markdown(report)))
    atomic_write(out / CURVES[name][2], lambda p: plot_curve(p, name, report[name]))
