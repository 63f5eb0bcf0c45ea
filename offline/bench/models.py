"""`seqrec bench`: every backbone trained and evaluated under one protocol -> the reference tables.

    seqrec bench --data data/ml-100k --models sasrec,transformer --seeds 42,123,2023 --out results/ml-100k
    seqrec bench latency --models sasrec,transformer --dataset-name ml-100k --out results/latency

Each (model, seed) pair is one ordinary `train_retriever` run written as an artifact to
OUT/runs/<model>/seed<seed>, so a rerun skips what is finished, resumes what was interrupted,
and every number in a table comes from a folder `seqrec evaluate --artifact` can re-check.
The tables (OUT/results.{md,json,csv}) and resolved configs (OUT/configs/) are rewritten after
every run, so a long bench shows its progress.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever.atomic import atomic_write
from retriever.errors import SeqrecError

if TYPE_CHECKING:  # torch and the training stack load when a bench runs, not for `seqrec --help`
    from offline.data.prepared import PreparedDataset
    from retriever.config import RunConfig

log = logging.getLogger(__name__)

TABLE_KS = (1, 5, 10, 50)
TABLE_METRICS = tuple(f"{name}@{k}" for name in ("HR", "NDCG", "MRR") for k in TABLE_KS)
RUN_STATS = ("params", "flops", "seconds_per_epoch", "best_epoch", "seconds_to_best", "inference_ms")


@dataclass(frozen=True)
class ModelSpec:
    """One table row: its label (row name and run folder) and the YAML config it trains."""

    label: str
    config: Path


@dataclass(frozen=True)
class BenchOptions:
    overrides: tuple[str, ...] = ()  # section.key=value, applied to every model before the options below
    max_epochs: int | None = None
    budget_minutes: float | None = None
    infer_batch: int = 256


def resolve_models(models: str, configs_dir: Path, dataset: str | None) -> list[ModelSpec]:
    """``"sasrec,path/to/x.yaml"`` -> specs; a bare name means ``configs_dir/<dataset>/<name>.yaml``."""
    specs: list[ModelSpec] = []
    for entry in (m.strip() for m in models.split(",")):
        if not entry:
            continue
        if entry.endswith((".yaml", ".yml")):
            path = Path(entry)
        elif dataset is None:
            raise SeqrecError(f"model {entry!r}: give --dataset-name or --data to find {configs_dir}/<dataset>/"
                              f"{entry}.yaml, or pass a YAML path")
        else:
            path = configs_dir / dataset / f"{entry}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
            hint = f"; {path.parent} has: {', '.join(known)}" if known else " (see --configs-dir, --dataset-name)"
            raise SeqrecError(f"model {entry!r}: no config {path}{hint}")
        specs.append(ModelSpec(path.stem, path))
    labels = [s.label for s in specs]
    if not specs or len(set(labels)) != len(labels):
        raise SeqrecError(f"--models needs one or more distinct models, got {models!r}")
    return specs


def resolve_config(spec: ModelSpec, seed: int, options: BenchOptions) -> RunConfig:
    from retriever.config import load_config

    overrides = [*options.overrides, f"train.seed={seed}"]
    if options.budget_minutes is not None:
        overrides.append(f"train.budget_minutes={options.budget_minutes}")
    config = load_config(spec.config, overrides)
    if options.max_epochs is not None and config.train.epochs > options.max_epochs:
        config = load_config(spec.config, [*overrides, f"train.epochs={options.max_epochs}"])
    return config


def run_one(spec: ModelSpec, seed: int, data: PreparedDataset, out: Path, options: BenchOptions,
            *, write_config: bool) -> dict[str, Any]:
    """Train (or reuse) one run and measure it; any failure becomes the record's ``error``."""
    run_dir = out / "runs" / spec.label / f"seed{seed}"
    record: dict[str, Any] = {"model": spec.label, "seed": seed, "run": str(run_dir)}
    try:
        config = resolve_config(spec, seed, options)
        record["backbone"] = config.model.backbone
        if write_config:
            write_yaml_config(out / "configs" / f"{spec.label}.yaml", config, spec)
        record.update(train_and_measure(config, data, run_dir, options.infer_batch))
    except Exception as err:  # one model's failure must not end a bench of many; its row shows why
        log.error("%s seed %d failed: %s", spec.label, seed, err, exc_info=log.isEnabledFor(logging.DEBUG))
        record["error"] = f"{type(err).__name__}: {err}"
    return record


def train_and_measure(config: RunConfig, data: PreparedDataset, run_dir: Path, infer_batch: int) -> dict[str, Any]:
    from offline.jobs.train import train_retriever

    measured = run_dir / "bench.json"
    if (run_dir / "manifest.json").exists():
        stored = json.loads((run_dir / "config.json").read_text())
        if not same_config(config.model_dump(mode="json"), stored):
            raise SeqrecError(f"{run_dir} holds a run with another config; use a new --out or remove that folder")
        manifest = json.loads((run_dir / "manifest.json").read_text())
        if measured.exists() and json.loads(measured.read_text()).get("version") == manifest["version"]:
            log.info("%s: finished earlier, reusing it", run_dir)
            return dict(json.loads(measured.read_text()))
    else:
        resume = (run_dir / "run" / "last.pt").exists()
        log.info("training %s%s", run_dir, " (resuming)" if resume else "")
        train_retriever(config, data, run_dir, resume=resume)
    result = measure_run(run_dir, data, infer_batch)
    atomic_write(measured, lambda p: p.write_text(json.dumps(result, indent=2)))
    return result


def same_config(resolved: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Training adds the item-feature sizes to the stored model section; every other key must match.

    The stored config is read through today's schema first, so a key added since the run was made
    counts with its default instead of making every earlier run "another config".
    """
    from retriever.config import config_from_dict

    try:
        stored = config_from_dict(stored, source="stored config").model_dump(mode="json")
    except ValueError:
        return False
    model = {k: v for k, v in stored.get("model", {}).items() if k in resolved.get("model", {})}
    return {**stored, "model": model} == resolved


def measure_run(run_dir: Path, data: PreparedDataset, infer_batch: int) -> dict[str, Any]:
    """Metrics and training times from the artifact; size, FLOPs and inference speed measured on it."""
    import torch

    from offline.bench.measure import average_inference_steps, count_parameters, forward_flops, inference_seconds
    from retriever.artifact import load_artifact
    from retriever.train import resolve_device

    artifact = load_artifact(run_dir, with_index=False)
    device = resolve_device(artifact.config)  # also applies the config's CPU thread count
    model = artifact.model.to(device)
    manifest, max_len = artifact.manifest, artifact.max_len
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    test = data.split().inputs("test")
    training = manifest["training"]
    return {
        "version": manifest["version"],
        "max_len": max_len,
        "params": count_parameters(model),
        "flops": forward_flops(model.encoder, max_len, data.n_items, device),
        "inference_ms": round(1000 * inference_seconds(model, test, max_len, infer_batch, device), 2),
        "average_steps": average_inference_steps(model, test, max_len, infer_batch, device),
        "seconds_per_epoch": round(statistics.fmean(r["epoch_seconds"] for r in history), 3),
        "best_epoch": training["best_epoch"],
        "epochs_run": training["epochs_run"],
        "seconds_to_best": training["seconds_to_best"],
        "seconds": training["seconds"],
        "sequences_per_second": training["sequences_per_second"],
        "torch_threads": torch.get_num_threads(),
        "valid": manifest["metrics"]["valid"],
        "test": manifest["metrics"]["test"],
    }


def mean_std(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (n - 1 in the denominator; None for one value), to 6 decimals."""
    array = np.asarray(values, dtype=np.float64)
    std = round(float(array.std(ddof=1)), 6) if len(array) > 1 else None
    return {"mean": round(float(array.mean()), 6), "std": std}


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model, in order: mean ± std over its finished seeds; failed seeds go to the notes."""
    rows: list[dict[str, Any]] = []
    for label in dict.fromkeys(r["model"] for r in records):
        runs = [r for r in records if r["model"] == label]
        done = [r for r in runs if "error" not in r]
        notes = [f"seed {r['seed']} failed: {r['error']}" for r in runs if "error" in r]
        row: dict[str, Any] = {"model": label, "backbone": next((r["backbone"] for r in runs if "backbone" in r), None),
                               "seeds": [r["seed"] for r in done]}
        if not done:  # the error cell says why; the notes list the seeds only when their errors differ
            same = len({r["error"] for r in runs}) == 1
            rows.append({**row, "error": runs[0]["error"], "notes": "" if same else "; ".join(notes)})
            continue
        for split in ("test", "valid"):
            row[split] = {m: mean_std([r[split][m] for r in done]) for m in done[0][split]}
        row.update({key: mean_std([r[key] for r in done]) for key in RUN_STATS})
        row["max_len"] = done[0]["max_len"]
        steps = [r["average_steps"] for r in done if r.get("average_steps") is not None]
        if steps:
            row["average_steps"] = mean_std(steps)
            notes.insert(0, f"{row['average_steps']['mean']:.2f} steps on average at inference (test)")
        rows.append({**row, "notes": "; ".join(notes)})
    measured = [r for r in rows if "flops" in r]
    if not measured:
        return rows
    reference = next((r for r in measured if r["backbone"] == "sasrec"), measured[0])
    for row in measured:
        row["relative_flops"] = row["flops"]["mean"] / reference["flops"]["mean"]
        row["flops_reference"] = reference["model"]
        if row["max_len"] != reference["max_len"]:
            row["notes"] = "; ".join(filter(None, [f"FLOPs at max_len {row['max_len']}", row["notes"]]))
    return rows


def _cell(stat: dict[str, Any] | None, fmt: str) -> str:
    if stat is None:
        return "—"
    text = format(stat["mean"], fmt)
    return text if stat["std"] is None else f"{text} ± {format(stat['std'], fmt)}"


def markdown_table(rows: Sequence[dict[str, Any]], split: str) -> str:
    """The seed-000 layout; the test table also carries size, compute, speed and notes."""
    full = split == "test"
    head = ["Model", *(["Params", "FLOPs (rel.)"] if full else []), *TABLE_METRICS,
            *(["s / epoch", "best epoch", "ms / batch", "notes"] if full else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = ["—"] * (len(head) - 1)
        if "error" in row and full:
            cells[-1] = f"**error**: {row['error']}"
        elif "error" not in row:
            cells = [_cell(row[split].get(m), ".4f") for m in TABLE_METRICS]
            if full:
                cells = [f"{row['params']['mean']:,.0f}", f"{row['relative_flops']:.2f}×", *cells,
                         _cell(row["seconds_per_epoch"], ".2f"), _cell(row["best_epoch"], ".1f"),
                         _cell(row["inference_ms"], ".1f"), row["notes"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in [row["model"], *cells]) + " |")
    return "\n".join(lines)


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """One line per model; every statistic as separate mean and std columns."""
    stats = [(split, m) for split in ("test", "valid") for m in TABLE_METRICS]
    header = ["model", "backbone", "seeds", "relative_flops", "flops_per_sequence"]
    header += [f"{split}_{m}_{part}" for split, m in stats for part in ("mean", "std")]
    header += [f"{key}_{part}" for key in RUN_STATS if key != "flops" for part in ("mean", "std")]
    header += ["average_steps", "notes", "error"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        line: dict[str, Any] = {"model": row["model"], "backbone": row["backbone"],
                                "seeds": " ".join(map(str, row["seeds"])), "notes": row["notes"],
                                "error": row.get("error", "")}
        if "error" not in row:
            line["relative_flops"] = round(row["relative_flops"], 4)
            line["flops_per_sequence"] = row["flops"]["mean"]
            for split, m in stats:
                stat = row[split].get(m, {})
                line[f"{split}_{m}_mean"], line[f"{split}_{m}_std"] = stat.get("mean"), stat.get("std")
            for key in RUN_STATS:
                line[f"{key}_mean"], line[f"{key}_std"] = row[key]["mean"], row[key]["std"]
            line["average_steps"] = (row.get("average_steps") or {}).get("mean")
        writer.writerow(["" if line.get(h) is None else line[h] for h in header])
    return buffer.getvalue()


def write_results(out: Path, records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, Any]]:
    rows = summarize(records)
    reference = next((r["flops_reference"] for r in rows if "flops_reference" in r), None)
    limits = [f"epochs capped at {meta['max_epochs']}" if meta["max_epochs"] else "",
              f"{meta['budget_minutes']} min wall-clock budget per run" if meta["budget_minutes"] else ""]
    limit = "; ".join(filter(None, limits))
    text = "\n\n".join([
        f"# Benchmark: {meta['dataset']}",
        f"Data `{meta['data']}` ({meta['users']:,} users, {meta['items']:,} items); seeds "
        f"{', '.join(map(str, meta['seeds']))}; each cell is the mean ± sample std over the seeds that finished."
        + (f" **Quick comparison: {limit}.**" if limit else ""),
        "Leave-one-out, full ranking over every item, history excluded, ties counted against the target; "
        "each run keeps its best validation NDCG@10 epoch. FLOPs (rel.): one encoder forward over a sequence "
        f"of max_len items, counted with `torch.utils.flop_counter`, relative to {reference or '—'}. "
        "s / epoch: training pass only (no validation); best epoch: epochs to the best validation; "
        f"ms / batch: scoring {min(meta['infer_batch'], meta['users'])} test users against every item.",
        "## Test", markdown_table(rows, "test"), "## Validation", markdown_table(rows, "valid"),
        *meta.get("remarks", []),
        f"Reproduce: `{meta['command']}`. Runs (artifacts): "
        + ("the `runs/` folder of each source command's `--out`" if meta.get("sources") else f"`{out / 'runs'}`")
        + f"; resolved configs: `{out / 'configs'}`.",
    ]) + "\n"
    atomic_write(out / "results.md", lambda p: p.write_text(text))
    payload = {**meta, "models": rows, "runs": list(records)}
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(payload, indent=2) + "\n"))
    atomic_write(out / "results.csv", lambda p: p.write_text(csv_text(rows)))
    return rows


MERGE_KEYS = ("dataset", "users", "items", "max_epochs", "budget_minutes", "infer_batch")


def merge_results(sources: Sequence[Path], out: Path, remarks: Sequence[str] = (),
                  min_seeds: int = 0, models: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One table from several `seqrec bench` outputs on the same data (e.g. models run on different days).

    The per-run records are taken as they are (nothing is retrained or re-measured); sources must agree
    on the dataset, its size and the quick-comparison limits, and no (model, seed) run may appear twice.
    ``models``: only these models' runs (the others are ignored, duplicates included). The resolved
    configs of the models in the table are copied beside it.
    """
    import shutil

    payloads = []
    for source in sources:
        path = source / "results.json" if source.is_dir() else source
        try:
            payloads.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as err:
            raise SeqrecError(f"cannot read {path}: {err}") from None
    if not payloads:
        raise SeqrecError("seqrec bench merge needs at least one --from")
    first_path, first = payloads[0]
    for path, payload in payloads[1:]:
        for key in MERGE_KEYS:
            if payload.get(key) != first.get(key):
                raise SeqrecError(f"{path} has {key}={payload.get(key)!r} but {first_path} has {first.get(key)!r}; "
                                  "only runs on the same data under the same limits make one table")
    records: list[dict[str, Any]] = []
    seen: dict[tuple[str, int], Path] = {}
    for path, payload in payloads:
        for record in payload.get("runs", []):
            if models and str(record["model"]) not in models:
                continue
            run = (str(record["model"]), int(record["seed"]))
            if run in seen:
                raise SeqrecError(f"{run[0]} seed {run[1]} is in both {seen[run]} and {path}")
            seen[run] = path
            records.append(record)
    if min_seeds:  # a table of complete rows only: models with fewer finished seeds are left out, failures too
        finished: dict[str, set[int]] = {}
        for record in records:
            if "error" not in record:
                finished.setdefault(str(record["model"]), set()).add(int(record["seed"]))
        keep = {model for model, done in finished.items() if len(done) >= min_seeds}
        dropped = sorted({str(r["model"]) for r in records} - keep)
        if dropped:
            log.info("left out (fewer than %d finished seeds): %s", min_seeds, ", ".join(dropped))
        records = [r for r in records if r["model"] in keep and "error" not in r]
    absent = [m for m in models if m not in {str(r["model"]) for r in records}]
    if absent:
        raise SeqrecError(f"no {'complete ' if min_seeds else ''}runs of {', '.join(absent)} in the sources")
    seeds = list(dict.fromkeys(seed for _, p in payloads for seed in p.get("seeds", [])))
    commands = "`; `".join(p["command"] for _, p in payloads)
    meta = {**{key: first.get(key) for key in MERGE_KEYS}, "data": first.get("data"), "seeds": seeds,
            "models_requested": [m for _, p in payloads for m in p.get("models_requested", [])],
            "command": f"{commands}`, merged by `seqrec bench merge "
                       + " ".join(f"--from {path.parent}" for path, _ in payloads)
                       + (f" --min-seeds {min_seeds}" if min_seeds else "")
                       + (f" --models {','.join(models)}" if models else "") + f" --out {out}",
            "sources": [str(path) for path, _ in payloads],
            # the sources' own remarks stay: a caveat about some rows must survive later merges
            "remarks": list(dict.fromkeys([*(r for _, p in payloads for r in p.get("remarks", [])), *remarks]))}
    out.mkdir(parents=True, exist_ok=True)
    kept = {str(r["model"]) for r in records}
    for path, _ in payloads:
        configs = path.parent / "configs"
        if configs.is_dir() and configs.resolve() != (out / "configs").resolve():
            (out / "configs").mkdir(exist_ok=True)
            for config in configs.glob("*.yaml"):
                if config.stem in kept:
                    shutil.copy2(config, out / "configs" / config.name)
    return write_results(out, records, meta)


def _run_merge(args: argparse.Namespace) -> int:
    if args.min_seeds < 0:
        raise SeqrecError(f"--min-seeds must be >= 0, got {args.min_seeds}")
    models = [m for m in (args.models or "").split(",") if m]
    rows = merge_results(args.sources, args.out, args.remark or [], args.min_seeds, models)
    print(f"{len(rows)} models -> {args.out / 'results.md'} (.json, .csv)")
    return 0


def write_yaml_config(path: Path, config: RunConfig, spec: ModelSpec) -> None:
    import yaml

    header = f"# {spec.label}: {spec.config} as `seqrec bench` resolved it (train.seed is set per run)\n"
    body = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: p.write_text(header + body))


def run_bench(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared

    if args.data is None or args.models is None or args.out is None:
        raise SeqrecError("seqrec bench needs --data, --models and --out (or: seqrec bench latency ...)")
    if (args.max_epochs is not None and args.max_epochs < 1) or args.infer_batch < 1 or (
            args.budget_minutes is not None and args.budget_minutes <= 0):
        raise SeqrecError("--max-epochs and --infer-batch must be >= 1 and --budget-minutes > 0")
    seeds = list(dict.fromkeys(parse_ints(args.seeds, "--seeds")))  # a repeated seed would count one run twice
    dataset = args.dataset_name or args.data.resolve().name
    specs = resolve_models(args.models, args.configs_dir, dataset)
    data = load_prepared(args.data)
    options = BenchOptions(tuple(shorthand_overrides(args)), args.max_epochs, args.budget_minutes, args.infer_batch)
    meta = {"dataset": dataset, "data": str(args.data), "users": data.n_users, "items": data.n_items,
            "seeds": seeds, "models_requested": [str(s.config) for s in specs], "max_epochs": args.max_epochs,
            "budget_minutes": args.budget_minutes, "infer_batch": args.infer_batch, "command": _command(args)}
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    total = len(specs) * len(seeds)
    for spec in specs:
        for seed in seeds:
            log.info("[%d/%d] %s, seed %d", len(records) + 1, total, spec.label, seed)
            records.append(run_one(spec, seed, data, args.out, options, write_config=seed == seeds[0]))
            rows = write_results(args.out, records, meta)
    for row in rows:
        test = row.get("test", {}).get("NDCG@10")
        print(f"{row['model']:<20} " + (f"test NDCG@10 {_cell(test, '.4f')}" if test else f"error: {row['error']}"))
    print(f"tables -> {args.out / 'results.md'} (.json, .csv)")
    return 0


def shorthand_overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.set or [])
    for flag, key in (("threads", "train.threads"), ("device", "train.device")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return overrides


def _command(args: argparse.Namespace) -> str:
    parts = ["seqrec bench", f"--data {args.data}", f"--models {args.models}", f"--seeds {args.seeds}",
             f"--out {args.out}", f"--configs-dir {args.configs_dir}"]
    parts += [f"--dataset-name {args.dataset_name}"] if args.dataset_name else []
    for flag in ("max_epochs", "budget_minutes", "threads", "device"):
        if getattr(args, flag) is not None:
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    parts += [f"--set {item}" for item in args.set or []]
    return " ".join(parts)


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SeqrecError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise SeqrecError(f"{flag} is empty")
    return values


def add_bench_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "bench", parents=[common], help="train and evaluate several backbones over seeds; write the tables",
        description="Train every model with its committed config (CONFIGS_DIR/<dataset>/<model>.yaml) once per "
        "seed, evaluate valid and test with full ranking, measure parameters, FLOPs and speed, and write "
        "OUT/results.{md,json,csv}: mean ± std over seeds. Runs go to OUT/runs/<model>/seed<seed>; "
        "rerunning skips finished runs and resumes interrupted ones; a failing model gets an error row.",
        epilog="`seqrec bench latency --help`: forward latency and throughput against sequence length.",
    )
    p.add_argument("--data", type=Path, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--models", help="comma-separated config names (e.g. sasrec,transformer) or YAML paths")
    p.add_argument("--seeds", default="42,123,2023", help="comma-separated training seeds")
    p.add_argument("--out", type=Path, help="folder for the tables and runs")
    _add_config_lookup(p)
    p.add_argument("--max-epochs", type=int, default=None, help="cap train.epochs (quick comparisons)")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="wall-clock cap per run: stop after the epoch that crosses it, keep the best epoch")
    p.add_argument("--infer-batch", type=int, default=256, help="test users per timed inference batch")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="config override for every model (repeatable), e.g. --set train.patience=5")
    p.add_argument("--threads", type=int, default=None, help="shorthand for --set train.threads=N")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="shorthand for train.device")
    p.set_defaults(handler=run_bench)
    tools = p.add_subparsers(dest="bench_tool", metavar="{latency,serve,index,merge,scale}", required=False)
    merge = tools.add_parser(
        "merge", parents=[common], help="one table from several bench outputs on the same data",
        description="Read the per-run records of several `seqrec bench` outputs (same dataset and limits; "
        "each (model, seed) once) and write OUT/results.{md,json,csv} from them, nothing retrained.",
    )
    merge.add_argument("--from", dest="sources", type=Path, action="append", required=True,
                       help="a bench --out folder or its results.json (repeatable; models keep this order)")
    merge.add_argument("--out", type=Path, required=True, help="folder for the merged tables")
    merge.add_argument("--remark", action="append", help="a paragraph for the table's text (repeatable)")
    merge.add_argument("--min-seeds", type=int, default=0,
                       help="keep only models with at least this many finished seeds (complete rows)")
    merge.add_argument("--models", default=None,
                       help="comma-separated: only these models' runs (e.g. to keep unfinished rows apart)")
    merge.set_defaults(handler=_run_merge)
    lat = tools.add_parser(
        "latency", parents=[common], help="forward latency and throughput against sequence length",
        description="Build each model from its config with max_len set to the longest length and randomly "
        "initialised weights (latency does not depend on training), time the inference forward (user "
        "vectors; median of --reps after --warmup, inference mode) of a batch of random histories at each "
        "length, fit the log-log slope alpha, and write OUT/latency.{json,md,png}.",
    )
    lat.add_argument("--models", required=True, help="comma-separated config names or YAML paths")
    lat.add_argument("--lengths", default="64,128,256,512,1024,1536", help="comma-separated sequence lengths")
    lat.add_argument("--batch", type=int, default=32, help="sequences per timed batch")
    lat.add_argument("--out", type=Path, required=True, help="folder for latency.{json,md,png}")
    lat.add_argument("--data", type=Path, default=None,
                     help="prepared folder: catalogue size and default dataset name (optional)")
    _add_config_lookup(lat)
    lat.add_argument("--n-items", type=int, default=10_000, help="catalogue size without --data")
    lat.add_argument("--reps", type=int, default=10, help="timed repetitions per length")
    lat.add_argument("--warmup", type=int, default=3, help="untimed repetitions per length")
    lat.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="config override (repeatable)")
    lat.add_argument("--threads", type=int, default=None, help="shorthand for --set train.threads=N")
    lat.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="shorthand for train.device")
    lat.set_defaults(handler=_run_latency)
    srv = tools.add_parser(
        "serve", parents=[common], help="open-loop HTTP load against the service and a no-op FastAPI app",
        description="Start the service (one uvicorn process per bundle) and a no-op FastAPI app, offer each "
        "the same request bodies at fixed open-loop rates (latency counted from each request's due time), "
        "and write OUT/serve.{json,md}: p99 at --check-rate, the highest rate held with p99 <= 50 ms and 0 "
        "errors, and its ratio to the no-op app's.",
    )
    srv.add_argument("--artifact", type=Path, action="append", required=True,
                     help="bundle to serve (repeatable: one row per bundle)")
    srv.add_argument("--out", type=Path, required=True, help="folder for serve.{json,md}")
    srv.add_argument("--rates", default="50,100,150,200,300,400,600,800,1200,1600,2400,3200,4800",
                     help="offered rates (requests/s), stepped up until one fails the target")
    srv.add_argument("--check-rate", type=float, default=100.0, help="the rate whose p99 is reported")
    srv.add_argument("--duration", type=float, default=10.0, help="seconds measured per rate")
    srv.add_argument("--warmup", type=float, default=2.0, help="seconds per rate before measuring")
    srv.add_argument("--arrivals", choices=["poisson", "uniform"], default="poisson")
    srv.add_argument("--timeout", type=float, default=2.0, help="request timeout (counts as an error)")
    srv.add_argument("--requests", type=int, default=500, help="distinct request bodies")
    srv.add_argument("--min-len", type=int, default=50, help="shortest history")
    srv.add_argument("--max-len", type=int, default=200, help="longest history")
    srv.add_argument("--k", type=int, default=10)
    srv.add_argument("--candidates", type=int, default=200)
    srv.add_argument("--no-rerank", action="store_true", help="retrieval only")
    srv.add_argument("--personalize", action="store_true", help="every request asks for PCRec-simple")
    srv.add_argument("--threads", type=int, default=1, help="server torch threads")
    srv.add_argument("--max-batch", type=int, default=32, help="server micro-batch size")
    srv.add_argument("--max-wait-ms", type=float, default=2.0, help="server micro-batch wait")
    srv.add_argument("--seed", type=int, default=0)
    srv.set_defaults(handler=_run_serve_bench)
    idx = tools.add_parser(
        "index", parents=[common], help="build time, size, latency and recall of FAISS indexes per catalogue size",
        description="For each --sizes catalogue, build the exact index and each approximate structure, sweep "
        "its search parameter, and write OUT/index.{json,md}: build seconds, serialised size, recall@k against "
        "exact search, batch-1 p50/p99 and batch-64 latency, and the cheapest setting reaching --target-recall.",
    )
    idx.add_argument("--out", type=Path, required=True, help="folder for index.{json,md}")
    idx.add_argument("--sizes", default="100000,1000000", help="comma-separated catalogue sizes")
    idx.add_argument("--structures", default="hnsw,ivf,ivfpq",
                     help="of hnsw, ivf, ivfpq (flat, the exact reference, always runs)")
    idx.add_argument("--distribution", choices=["clustered", "gaussian"], default="clustered",
                   help="synthetic catalogue shape (ignored with --artifact or --vectors)")
    idx.add_argument("--spread", type=float, default=1.0,
                     help="clustered: noise scale around each centre (0 = points on the centres)")
    idx.add_argument("--dim", type=int, default=64, help="synthetic vector dimension")
    idx.add_argument("--artifact", type=Path, default=None, help="use this bundle's item vectors (first --sizes rows)")
    idx.add_argument("--vectors", type=Path, default=None, help="use an (n, d) .npy matrix")
    idx.add_argument("--queries", type=int, default=2000, help="held-out queries for recall")
    idx.add_argument("--latency-queries", type=int, default=500, help="single-query searches timed for batch-1")
    idx.add_argument("--k", type=int, default=100, help="neighbours per query (recall@k)")
    idx.add_argument("--target-recall", type=float, default=0.98)
    idx.add_argument("--threads", type=int, default=1, help="search threads (the service searches on one)")
    idx.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    idx.add_argument("--max-latency-ms", type=float, default=20.0, help="stop a sweep past this batch-1 p50")
    idx.add_argument("--seed", type=int, default=0)
    idx.set_defaults(handler=_run_index_bench)
    scl = tools.add_parser(
        "scale", parents=[common], help="training time, serving p99 and memory against data and catalogue size",
        description="Three scaling curves with fitted log-log slopes: seconds of one training epoch against "
        "interactions (synthetic data, fixed catalogue); p50/p99 of an open-loop load on a served random-init "
        "bundle against catalogue size; training peak RSS (fixed steps and batch) and server RSS against "
        "catalogue size, beside the item tables' bytes. Each training point runs in its own process. Writes "
        "OUT/scale.{json,md} and OUT/{train_time,serve_p99,memory}.png.",
    )
    scl.add_argument("--out", type=Path, required=True, help="folder for scale.{json,md} and the PNGs")
    scl.add_argument("--config", type=Path, default=Path("configs/synthetic/transformer.yaml"),
                     help="run config to train and serve")
    scl.add_argument("--curves", default="train,serve,memory", help="comma-separated subset of train,serve,memory")
    scl.add_argument("--interactions", default="100000,1000000,10000000", help="training curve sizes (1e5 works)")
    scl.add_argument("--train-items", type=int, default=100_000, help="fixed catalogue of the training curve")
    scl.add_argument("--mean-length", type=float, default=20.0, help="mean synthetic sequence length")
    scl.add_argument("--valid-users", type=int, default=256, help="fixed users validated after each epoch")
    scl.add_argument("--catalogues", default="10000,100000,1000000", help="catalogue sizes (serving and memory)")
    scl.add_argument("--rate", type=float, default=50.0, help="offered requests/s (open loop, Poisson)")
    scl.add_argument("--duration", type=float, default=10.0, help="seconds measured per catalogue")
    scl.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    scl.add_argument("--requests", type=int, default=500, help="distinct request bodies")
    scl.add_argument("--min-len", type=int, default=20, help="shortest request history")
    scl.add_argument("--max-len", type=int, default=50, help="longest request history")
    scl.add_argument("--index", choices=["auto", "flat", "hnsw", "ivf"], default="auto",
                     help="the serving bundles' index (auto: exact up to 200,000 items, else HNSW)")
    scl.add_argument("--memory-steps", type=int, default=20, help="training steps per memory point (about)")
    scl.add_argument("--threads", type=int, default=1, help="torch threads for training, serving and index builds")
    scl.add_argument("--point-timeout", type=float, default=3600.0,
                     help="seconds a training process or a server start may take before its point fails")
    scl.add_argument("--seed", type=int, default=0)
    scl.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="config override (repeatable)")
    scl.add_argument("--keep-work", action="store_true", help="keep OUT/work (data, runs, bundles)")
    scl.add_argument("--note", default="", help="a line for the notes (e.g. where the figures were taken)")
    scl.set_defaults(handler=_run_scale)


def _add_config_lookup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs-dir", type=Path, default=Path("configs"), help="where <dataset>/<model>.yaml live")
    p.add_argument("--dataset-name", default=None, help="config folder to use (default: the --data folder's name)")


def _run_serve_bench(args: argparse.Namespace) -> int:
    from offline.bench.serve import run_serve_bench  # the load client loads only here

    return run_serve_bench(args)


def _run_index_bench(args: argparse.Namespace) -> int:
    from offline.bench.index import run_index_bench  # faiss loads only here

    return run_index_bench(args)


def _run_scale(args: argparse.Namespace) -> int:
    from offline.bench.scale import run_scale  # torch, faiss and matplotlib load only here

    return run_scale(args)


def _run_latency(args: argparse.Namespace) -> int:
    from offline.bench.latency import run_latency  # matplotlib and the timing loop load only here

    return run_latency(args)
