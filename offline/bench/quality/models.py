"""`seqrec bench`: every backbone trained and evaluated under one protocol -> the reference tables.

    seqrec bench --data data/ml-100k --models sasrec,transformer --seeds 42,123,2023 --out results/ml-100k

Each (model, seed) pair is one ordinary `train_retriever` run written as an artifact to
OUT/runs/<model>/seed<seed>, so a rerun skips what is finished, resumes what was interrupted,
and every number in a table comes from a folder `seqrec evaluate --artifact` can re-check.
The tables (OUT/results.{md,json,csv}, `offline.bench.quality.results`) and resolved configs (OUT/configs/)
are rewritten after every run, so a long bench shows its progress.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.lib.args import ModelSpec, parse_ints, resolve_models, shorthand_overrides
from offline.bench.quality.records import BenchMeta, RunRecord, config_sha256
from offline.bench.quality.results import cell, write_results

if TYPE_CHECKING:  # torch and the training stack load when a bench runs, not for `seqrec --help`
    from offline.data.prepared import PreparedDataset
    from retriever.config import RunConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchOptions:
    overrides: tuple[str, ...] = ()  # section.key=value, applied to every model before the options below
    max_epochs: int | None = None
    budget_minutes: float | None = None
    infer_batch: int = 256


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
            *, write_config: bool) -> RunRecord:
    """Train (or reuse) one run and measure it; any failure becomes the record's ``error``."""
    run_dir = out / "runs" / spec.label / f"seed{seed}"
    record: dict[str, Any] = {"model": spec.label, "seed": seed, "run": str(run_dir)}
    try:
        config = resolve_config(spec, seed, options)
        record["backbone"] = config.model.backbone
        record["config_sha256"] = config_sha256(config.model_dump(mode="json"))
        if write_config:
            write_yaml_config(out / "configs" / f"{spec.label}.yaml", config, spec)
        record.update(train_and_measure(config, data, run_dir, options.infer_batch))
    except Exception as err:  # one model's failure must not end a bench of many; its row shows why
        log.error("%s seed %d failed: %s", spec.label, seed, err, exc_info=log.isEnabledFor(logging.DEBUG))
        record["error"] = f"{type(err).__name__}: {err}"
    return RunRecord.model_validate(record)


def train_and_measure(config: RunConfig, data: PreparedDataset, run_dir: Path, infer_batch: int) -> dict[str, Any]:
    from offline.jobs.train import train_retriever
    from retriever.artifact import read_manifest

    measured = run_dir / "bench.json"
    if (run_dir / "manifest.json").exists():
        stored = json.loads((run_dir / "config.json").read_text())
        if not same_config(config.model_dump(mode="json"), stored):
            raise SeqrecError(f"{run_dir} holds a run with another config; use a new --out or remove that folder")
        version = read_manifest(run_dir).version
        if measured.exists() and json.loads(measured.read_text()).get("version") == version:
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

    from offline.bench.lib.measure import average_inference_steps, count_parameters, forward_flops, inference_seconds
    from retriever.artifact import MANIFEST, ArtifactError, load_artifact
    from retriever.train import resolve_device

    artifact = load_artifact(run_dir, with_index=False)
    device = resolve_device(artifact.config)  # also applies the config's CPU thread count
    model = artifact.model.to(device)
    manifest, max_len = artifact.manifest, artifact.max_len
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    test = data.split().inputs("test")
    training = manifest.training
    if training is None:
        raise ArtifactError(run_dir / MANIFEST, "records no training summary; it was not written by `seqrec train`")
    return {
        "version": manifest.version,
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
        "valid": manifest.metrics["valid"],
        "test": manifest.metrics["test"],
    }


def write_yaml_config(path: Path, config: RunConfig, spec: ModelSpec) -> None:
    import yaml

    header = f"# {spec.label}: {spec.config} as `seqrec bench` resolved it (train.seed is set per run)\n"
    body = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: p.write_text(header + body))


def bench_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this bench (for the tables' text)."""
    parts = ["seqrec bench", f"--data {args.data}", f"--models {args.models}", f"--seeds {args.seeds}",
             f"--out {args.out}", f"--configs-dir {args.configs_dir}"]
    parts += [f"--dataset-name {args.dataset_name}"] if args.dataset_name else []
    for flag in ("max_epochs", "budget_minutes", "threads", "device"):
        if getattr(args, flag) is not None:
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    parts += [f"--set {item}" for item in args.set or []]
    return " ".join(parts)


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
    meta = BenchMeta(dataset=dataset, data=str(args.data), users=data.n_users, items=data.n_items, seeds=seeds,
                     models_requested=[str(s.config) for s in specs], max_epochs=args.max_epochs,
                     budget_minutes=args.budget_minutes, infer_batch=args.infer_batch, command=bench_command(args))
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[RunRecord] = []
    rows: list[dict[str, Any]] = []
    total = len(specs) * len(seeds)
    for spec in specs:
        for seed in seeds:
            log.info("[%d/%d] %s, seed %d", len(records) + 1, total, spec.label, seed)
            records.append(run_one(spec, seed, data, args.out, options, write_config=seed == seeds[0]))
            rows = write_results(args.out, records, meta)
    for row in rows:
        test = row.get("test", {}).get("NDCG@10")
        print(f"{row['model']:<20} " + (f"test NDCG@10 {cell(test, '.4f')}" if test else f"error: {row['error']}"))
    print(f"tables -> {args.out / 'results.md'} (.json, .csv)")
    failed = sum(1 for record in records if record.error)
    if failed:  # the tables hold every finished run; a script must still see that some did not finish
        print(f"seqrec bench: {failed} of {len(records)} runs failed (their rows say why)", file=sys.stderr)
    return 1 if failed else 0


def run_merge(args: argparse.Namespace) -> int:
    from offline.bench.quality.results import merge_results

    if args.min_seeds < 0:
        raise SeqrecError(f"--min-seeds must be >= 0, got {args.min_seeds}")
    models = [m for m in (args.models or "").split(",") if m]
    rows = merge_results(args.sources, args.out, args.remark or [], args.min_seeds, models)
    print(f"{len(rows)} models -> {args.out / 'results.md'} (.json, .csv)")
    return 0
