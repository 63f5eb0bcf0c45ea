"""The two-stage system (`seqrec pipeline`) under leave-one-out and under the global temporal protocol.

    python -m offline.bench.quality.temporal_pipeline --config configs/pipeline/ml-100k-download.yaml \
        --data-path /work/shared/data/ml-100k/raw --work /tmp/tpipe-bench/ml-100k --seeds 42 \
        --out docs/results/temporal/two-stage-ml-100k.json

Each run is `offline.jobs.pipeline.run_pipeline` (the command's own code) on the committed pipeline config, with
``train.seed`` set to the seed and, under temporal, ``split: {protocol: temporal}`` at the default
cuts. Every run's figures go to WORK/runs/<protocol>-<seed>.json (a rerun skips runs already there, so seeds can be
added one invocation at a time); --out collects them under the `rankings` keys of docs/results/temporal/ml-100k.json:
rankings.<loo|temporal>.two-stage = {valid, test (mean NDCG@10 over the seeds), test_std (sample std, null for one
seed), seeds} and, for temporal, test_window_recall@10.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from offline.data.protocols import PROTOCOLS

log = logging.getLogger(__name__)

SYSTEM = "two-stage"


def derived_config(config: Path, data_path: Path | None, seed: int, protocol: str, out: Path) -> Path:
    """The pipeline config with the seed (and the data's path, its retriever's path made absolute) set."""
    raw = yaml.safe_load(config.read_text())
    if raw.get("retriever") is not None:
        raw["retriever"] = str((config.resolve().parent / raw["retriever"]).resolve())
    if data_path is not None:
        raw["data"] = {**raw["data"], "path": str(data_path.resolve()), "download": False}
    raw["overrides"] = {**raw.get("overrides", {}), "train.seed": seed}
    if protocol == "temporal":
        raw["split"] = {"protocol": "temporal"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def run_one(config: Path, data_path: Path | None, seed: int, protocol: str, work: Path) -> dict[str, Any]:
    from offline.jobs.pipeline import run_pipeline

    path = work / "runs" / f"{protocol}-{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    derived = derived_config(config, data_path, seed, protocol, work / "configs" / f"{protocol}-{seed}.yaml")
    started = time.perf_counter()
    summary = run_pipeline(derived, work / "artifacts" / f"{protocol}-{seed}", threads=1)
    ev = summary.evaluation
    run = {"protocol": protocol, "seed": seed, "version": summary.version,
           "seconds": round(time.perf_counter() - started, 1), "load_average": os.getloadavg(),
           "valid": ev["valid"], "test": ev["test"], "retriever_valid": ev.get("retriever_valid"),
           "retriever_test": ev.get("retriever_test"), "system": ev["system"], "depth": ev["depth"],
           **({"temporal": ev["temporal"]} if "temporal" in ev else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=2))
    return run


def rankings(runs: list[dict[str, Any]], metric: str = "NDCG@10") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        chosen = [r for r in runs if r["protocol"] == protocol]
        if not chosen:
            continue
        tests = [r["test"][metric] for r in chosen]
        entry = {"valid": round(statistics.mean(r["valid"][metric] for r in chosen), 6),
                 "test": round(statistics.mean(tests), 6),
                 "test_std": round(statistics.stdev(tests), 6) if len(tests) > 1 else None, "seeds": len(chosen)}
        if protocol == "temporal":
            entry["test_window_recall@10"] = round(statistics.mean(
                r["temporal"]["test"]["window_recall"]["Recall@10"] for r in chosen), 6)
        out[protocol] = {SYSTEM: entry}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, required=True, help="pipeline config YAML")
    p.add_argument("--data-path", type=Path, default=None, help="the data's source files (instead of the config's)")
    p.add_argument("--work", type=Path, required=True, help="folder for the runs' artifacts and figures")
    p.add_argument("--seeds", type=int, nargs="+", default=[42])
    p.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    p.add_argument("--out", type=Path, default=None, help="results JSON of every run found in WORK/runs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from offline.cli.common import set_threads

    set_threads(1)
    started = time.perf_counter()
    for protocol in args.protocols:
        for seed in args.seeds:
            run = run_one(args.config, args.data_path, seed, protocol, args.work)
            print(f"{protocol} seed {seed}: valid NDCG@10 {run['valid']['NDCG@10']:.4f}, "
                  f"test {run['test']['NDCG@10']:.4f} ({run['seconds']:.0f} s)", flush=True)
    if args.out is not None:
        runs = [json.loads(f.read_text()) for f in sorted((args.work / "runs").glob("*.json"))]
        result = {"command": "python -m offline.bench.quality.temporal_pipeline "
                  + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
                  "config": str(args.config), "metric": "NDCG@10", "threads": 1,
                  "seconds": round(sum(r["seconds"] for r in runs), 1),
                  "load_average": os.getloadavg(), "rankings": rankings(runs), "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        log.info("wrote %s in %.0f s", args.out, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
