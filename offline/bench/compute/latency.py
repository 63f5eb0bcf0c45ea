"""`seqrec bench latency`: inference latency and throughput against sequence length (the xLSTM study).

Each model is built from its config with ``max_len`` set to the longest length and randomly
initialised weights: the work of a forward pass does not depend on what the weights learned
(adaptive-depth encoders aside, whose halting does). The timed call is the inference path,
``Retriever.user_vectors`` on a batch of random full-length histories; scoring against the
catalogue is left out because it does not grow with the length. Latency is the median of the
timed repetitions; ``alpha`` is the slope of log latency against log length (1 = linear).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.lib.args import ModelSpec, parse_ints, resolve_models, shorthand_overrides
from offline.bench.lib.measure import count_parameters, fit_alpha, timed
from offline.tables import markdown_table
from retriever.config import load_config
from retriever.train import resolve_device

log = logging.getLogger(__name__)


def latency_curve(spec: ModelSpec, lengths: Sequence[int], batch: int, n_items: int, *, reps: int, warmup: int,
                  overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Median latency and throughput at each length; a failure (e.g. out of memory) ends the curve there."""
    result: dict[str, Any] = {"model": spec.label, "config": str(spec.config), "points": []}
    try:
        config = load_config(spec.config, [*overrides, f"model.max_len={max(lengths)}"])
        device = resolve_device(config)
        torch.manual_seed(0)
        model = config.build(n_items).to(device).eval()
    except Exception as err:  # one model that cannot be built must not end the bench
        log.error("%s: %s", spec.label, err)
        return {**result, "error": f"{type(err).__name__}: {err}"}
    result.update(backbone=config.model.backbone, params=count_parameters(model), device=str(device),
                  threads=torch.get_num_threads())
    generator = torch.Generator().manual_seed(0)
    for length in lengths:
        try:  # the batch itself may not fit at long lengths
            ids = torch.randint(1, n_items + 1, (batch, length), generator=generator).to(device)  # (B, T), no padding
            seconds = statistics.median(timed(functools.partial(model.user_vectors, ids), reps=reps,
                                              warmup=warmup, device=device))
        except Exception as err:  # out of memory at long lengths, or a length the backbone refuses
            log.error("%s at length %d: %s", spec.label, length, err)
            result["error"] = f"length {length}: {type(err).__name__}: {err}"
            break
        result["points"].append({"length": length, "ms": round(1000 * seconds, 3),
                                 "sequences_per_second": round(batch / seconds, 1)})
        log.info("%s  length %5d  %9.2f ms  %9.1f seq/s", spec.label, length, 1000 * seconds, batch / seconds)
    points = result["points"]
    if len(points) >= 2:
        result["alpha"] = round(fit_alpha([p["length"] for p in points], [p["ms"] for p in points]), 3)
    return result


def plot_latency(curves: Sequence[dict[str, Any]], path: Path, batch: int) -> None:
    """Latency (with alpha) and throughput against length on log-log axes, one line per model."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    latency, throughput = figure.subplots(1, 2)
    for curve in curves:
        if not curve["points"]:
            continue
        lengths = [p["length"] for p in curve["points"]]
        alpha = f" (α = {curve['alpha']:.2f})" if "alpha" in curve else ""
        latency.loglog(lengths, [p["ms"] for p in curve["points"]], marker="o", label=curve["model"] + alpha)
        throughput.loglog(lengths, [p["sequences_per_second"] for p in curve["points"]], marker="o",
                            label=curve["model"])
    for axes, ylabel in ((latency, f"latency per batch of {batch} (ms)"), (throughput, "sequences / s")):
        axes.set_xlabel("sequence length")
        axes.set_ylabel(ylabel)
        axes.grid(True, which="both", alpha=0.3)
        if axes.has_data():
            axes.legend()
    figure.suptitle("Inference forward (user vectors), randomly initialised weights")
    figure.savefig(path, dpi=120, format="png")  # path may be a temp name


def latency_markdown(curves: Sequence[dict[str, Any]], lengths: Sequence[int], meta: dict[str, Any]) -> str:
    head = ["Model", "Params", *(f"L={n}" for n in lengths), "alpha"]
    rows = []
    for curve in curves:
        at = {p["length"]: p for p in curve["points"]}
        cells = [f"{at[n]['ms']:.1f} ms ({at[n]['sequences_per_second']:,.0f}/s)" if n in at else "—"
                 for n in lengths]
        alpha = f"{curve['alpha']:.2f}" if "alpha" in curve else "—"
        params = f"{curve['params']:,}" if "params" in curve else "—"
        rows.append([curve["model"], params, *cells, alpha])
    errors = [f"- {c['model']}: {c['error']}" for c in curves if "error" in c]
    return "\n\n".join([
        "# Inference latency against sequence length",
        f"Batch of {meta['batch']} random histories without padding, {meta['n_items']:,} items; each model "
        "built from its config with max_len = the longest length and **randomly initialised weights** "
        "(latency does not depend on training, except through an adaptive encoder's halting). Timed call: "
        f"`Retriever.user_vectors` in inference mode, median of {meta['reps']} repetitions after "
        f"{meta['warmup']} warm-up call(s), on {meta['device']} with {meta['threads']} thread(s). alpha: slope of "
        "log latency against log length (`np.polyfit`); 1 is linear, 2 quadratic.",
        markdown_table(head, rows),
        *(["Stopped early:\n" + "\n".join(errors)] if errors else []),
        "![latency](latency.png)",
    ]) + "\n"


def run_latency(args: argparse.Namespace) -> int:
    lengths = sorted(set(parse_ints(args.lengths, "--lengths")))
    if lengths[0] < 1 or args.batch < 1 or args.reps < 1 or args.warmup < 0:
        raise SeqrecError("--lengths and --batch must be >= 1, --reps >= 1, --warmup >= 0")
    n_items = args.n_items
    dataset = args.dataset_name
    if args.data is not None:
        from offline.data.prepared import read_manifest

        n_items = int(read_manifest(args.data)["items"])
        dataset = dataset or args.data.resolve().name
    specs = resolve_models(args.models, args.configs_dir, dataset)
    overrides = shorthand_overrides(args)
    curves = [latency_curve(spec, lengths, args.batch, n_items, reps=args.reps, warmup=args.warmup,
                            overrides=overrides) for spec in specs]
    built = next((c for c in curves if "device" in c), {"device": "—", "threads": "—"})
    meta = {"lengths": lengths, "batch": args.batch, "n_items": n_items, "reps": args.reps, "warmup": args.warmup,
            "dataset": dataset, "device": built["device"], "threads": built["threads"],
            "weights": "randomly initialised", "timed": "Retriever.user_vectors, inference mode, median"}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "latency.json",
                 lambda p: p.write_text(json.dumps({**meta, "models": curves}, indent=2) + "\n"))
    atomic_write(args.out / "latency.md", lambda p: p.write_text(latency_markdown(curves, lengths, meta)))
    atomic_write(args.out / "latency.png", lambda p: plot_latency(curves, p, args.batch))
    for curve in curves:
        alpha = f"alpha {curve['alpha']:.2f}" if "alpha" in curve else curve.get("error", "no timings")
        print(f"{curve['model']:<20} {alpha}")
    print(f"latency -> {args.out / 'latency.md'} (.json, .png)")
    return 0
