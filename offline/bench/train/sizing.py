"""`seqrec pipeline` on a config of only `name` and `data` (the sized defaults), with or without a time budget:
wall-clock from the start to the publish, the stage times, the figures, what the sizing chose and the plan.

    python -m offline.bench.train.sizing --dataset ml-100k --path /data/ml-100k/raw --threads 1 \
        --budget-minutes 30 --json docs/results/sizing/ml-100k-budget30.json

    python -m offline.bench.train.sizing --dataset synthetic --n-users 14000 --n-items 12000 --mean-length 40 \
        --first-epoch --threads 1 --json docs/results/sizing/synthetic-570k-first-epoch.json

``--first-epoch`` trains the sized retriever for one epoch only (the pipeline's first stage and its first epoch):
for data whose whole pipeline does not fit the session. The load average before and after is recorded: other
jobs on the machine slow every figure here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml


def _config(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {"dataset": args.dataset}
    if args.path is not None:
        data["path"] = str(Path(args.path).resolve())
    if args.dataset == "synthetic":
        data["synthetic"] = {"n_users": args.n_users, "n_items": args.n_items, "mean_length": args.mean_length,
                             "seed": args.seed}
    config: dict[str, Any] = {"name": f"sized-{args.dataset}", "data": data}
    if args.train_seed is not None:  # a given key: everything else stays sized
        config["overrides"] = {"train.seed": args.train_seed}
    return config


def _host() -> dict[str, Any]:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"load_average": list(os.getloadavg()), "cpus": os.cpu_count(), "git": sha}


def cpu_seconds() -> float:
    """This process's CPU time (user + system, children included): on a machine other jobs load, what one
    thread's wall-clock would be alone on its core, where the wall-clock here is not."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_pipeline_bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from offline.jobs.pipeline import run_pipeline

    config = work / "pipeline.yaml"
    config.write_text(yaml.safe_dump(_config(args)))
    start, cpu = time.perf_counter(), cpu_seconds()
    summary = run_pipeline(config, work / "artifacts", threads=args.threads, budget_minutes=args.budget_minutes)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    record = json.loads((Path(summary.path) / "pipeline.json").read_text())
    ev = summary.evaluation
    figures = {f"{system}_{split}_ndcg@10": ev[key]["NDCG@10"] for system, split, key in (
        ("retriever", "valid", "retriever_valid"), ("retriever", "test", "retriever_test"),
        ("two_stage", "valid", "valid"), ("two_stage", "test", "test")) if key in ev}
    budget = args.budget_minutes
    return {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "budget_minutes": budget,
            "within_budget_plus_10pct": None if budget is None else wall <= 1.1 * 60 * budget,
            "stage_seconds": summary.seconds, **figures, "ranker": record["stages"]["train-ranker"],
            "sizing": record["stages"]["train"].get("sizing"), "budget": record["stages"]["train"].get("budget"),
            "retriever_epochs": _epochs(Path(summary.path))}


def _epochs(bundle: Path) -> dict[str, Any]:
    training = json.loads((bundle / "manifest.json").read_text()).get("training") or {}
    return {k: training.get(k) for k in ("best_epoch", "epochs_run", "seconds", "sequences_per_second")}


def first_epoch_bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Prepare, size, probe, then train the sized retriever for one epoch (none with --sizing-only): its measured
    seconds."""
    from offline.data.prepare import Filters, prepare_dataset
    from offline.data.prepared import load_prepared
    from offline.data.readers import ReaderOptions
    from offline.jobs.budget import probe_costs
    from offline.jobs.sizing import data_shape, device_now, size_values
    from offline.jobs.train import train_retriever
    from retriever.config import load_config_with

    spec = _config(args)["data"]
    options = ReaderOptions(path=spec.get("path"), synthetic=spec.get("synthetic"))
    prepare_dataset(args.dataset, work / "data", options, Filters(3, None, None), overwrite=True)
    data = load_prepared(work / "data")
    values, record = size_values(data_shape(data), device_now(args.threads),
                                 {} if args.threads is None else {"train.threads": args.threads})
    if args.sizing_only:
        return {"sizing": record.model_dump(mode="json")}
    probe = probe_costs(load_config_with(None, values), data)
    variants = {}
    for variant in args.probe_variant:  # what the rules avoided, probed on the same data
        changes = _parse_variant(variant)
        costs = probe_costs(load_config_with(None, {**values, **changes}), data)
        variants[variant] = {"epoch_seconds": round(costs.epoch_seconds, 1),
                             "eval_seconds": round(costs.eval_seconds, 1)}
    manifest = train_retriever(load_config_with(None, {**values, "train.epochs": 1}), data, work / "bundle")
    training = manifest.training or {}
    history = [json.loads(line) for line in (work / "bundle" / "history.jsonl").read_text().splitlines() if line]
    return {"sizing": record.model_dump(mode="json"), "probe_epoch_seconds": round(probe.epoch_seconds, 1),
            "probe_eval_seconds": round(probe.eval_seconds, 1), "probe_variants": variants,
            "first_epoch": history[0] if history else None,
            "training_seconds_with_validation": training.get("seconds"),
            "valid_ndcg@10_after_one_epoch": manifest.metrics["valid"]["NDCG@10"]}


def _parse_variant(text: str) -> dict[str, Any]:
    """``loss.name=full,model.max_len=100`` -> {"loss.name": "full", "model.max_len": 100}."""
    pairs = (item.split("=", 1) for item in text.split(","))
    return {key: yaml.safe_load(value) for key, value in pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--path", default=None)
    p.add_argument("--n-users", type=int, default=2000)
    p.add_argument("--n-items", type=int, default=500)
    p.add_argument("--mean-length", type=float, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--train-seed", type=int, default=None, help="the pipeline: overrides train.seed (default 42)")
    p.add_argument("--budget-minutes", type=float, default=None)
    p.add_argument("--first-epoch", action="store_true", help="train the sized retriever's first epoch only")
    p.add_argument("--sizing-only", action="store_true", help="prepare and size only: what the rules choose")
    p.add_argument("--probe-variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                   help="--first-epoch: also probe the sized config with these changes (repeatable)")
    p.add_argument("--json", type=Path, required=True, help="result file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")  # the plan, the stages
    before = _host()
    with tempfile.TemporaryDirectory(prefix="sizing-bench-") as tmp:
        bench = first_epoch_bench if args.first_epoch or args.sizing_only else run_pipeline_bench
        result = bench(args, Path(tmp))
    out = {"command": "python -m offline.bench.train.sizing " + " ".join(sys.argv[1:] if argv is None else argv),
           "config": _config(args), "host_before": before, "host_after": _host(), **result}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("sizing", "budget", "ranker")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
