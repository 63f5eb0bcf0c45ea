"""`python -m offline.bench.quality.temporal`: the same models under leave-one-out and under the global temporal
split (offline/data/temporal.py), side by side, and how they rank under each (docs/temporal.md).

Every model is trained twice from its committed config, once per protocol, with `offline.jobs.train`'s own
`train_retriever` (the code `seqrec train` runs), and the popularity baseline is fitted per protocol as `seqrec
evaluate --model popularity` fits it. A run whose artifact is already in WORK is read back instead of retrained,
so seeds can be added by running the command again; the JSON says which runs were read back.

    python -m offline.bench.quality.temporal --data PREPARED --work /tmp/temporal-bench \
        --seeds 42 --out docs/results/temporal/ml-100k.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from common.atomic import atomic_write
from offline.cli.common import SEED, configure_logging
from offline.data.prepared import PreparedDataset, dataset_fingerprint, load_prepared
from offline.data.temporal import DEFAULT_TEST_CUT, DEFAULT_VALID_CUT, TemporalProtocol
from offline.evaluation.evaluate import EVAL_KS, evaluate_splits
from offline.evaluation.temporal import evaluate_popularity_temporal
from offline.tables import markdown_table

log = logging.getLogger(__name__)

CONFIGS = ("configs/ml-100k/sasrec.yaml", "configs/ml-100k/transformer.yaml")
PROTOCOLS = ("loo", "temporal")
METRIC = "NDCG@10"


def popularity_run(data: PreparedDataset, temporal: TemporalProtocol | None) -> dict[str, Any]:
    """The popularity baseline's figures under a protocol (the repeat policy chosen on validation: "auto")."""
    from retriever.popularity import Popularity
    from retriever.repeats import resolve_repeats

    if temporal is not None:
        result = evaluate_popularity_temporal(data, temporal, ks=EVAL_KS)
        return {"valid": result["valid"], "test": result["test"], "temporal": result["temporal"],
                "repeats": result["repeats"]}
    split = data.split()
    repeats = resolve_repeats("auto", data.repeat_shares["valid"])
    model = Popularity.fit(split.train.items, data.n_items)
    return {"repeats": repeats, **evaluate_splits(model.score, split, data.n_items, exclude_seen=repeats == "exclude")}


def retriever_run(config_path: str, seed: int, data: PreparedDataset, temporal: TemporalProtocol | None,
                  out: Path, threads: int, overrides: list[str]) -> dict[str, Any]:
    """Train (or read back) one retriever under a protocol; its figures from the artifact's manifest."""
    from offline.jobs.train import train_retriever
    from retriever.config import load_config

    manifest_path = out / "manifest.json"
    read_back = manifest_path.exists()
    if not read_back:
        config = load_config(Path(config_path), [f"train.seed={seed}", f"train.threads={threads}", *overrides])
        train_retriever(config, data, out, temporal=temporal)
    manifest = json.loads(manifest_path.read_text())
    training = manifest["training"]
    return {"artifact": str(out), "read_back": read_back, "valid": manifest["metrics"]["valid"],
            "test": manifest["metrics"]["test"], "temporal": manifest.get("protocol"),
            "best_epoch": training["best_epoch"], "seconds": training["seconds"],
            "refit_seconds": training.get("refit_seconds")}


def ranking(runs: list[dict[str, Any]], protocol: str) -> dict[str, dict[str, Any]]:
    """{model: {"valid": mean, "test": mean, "test_std", "seeds", "rank"}} of METRIC under ``protocol``, ranked by
    the test mean (1 = best)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["protocol"] == protocol:
            by_model.setdefault(run["model"], []).append(run)
    summary = {}
    for model, own in by_model.items():
        tests = [r["test"][METRIC] for r in own]
        summary[model] = {"valid": round(mean(r["valid"][METRIC] for r in own), 6), "test": round(mean(tests), 6),
                          "test_std": round(stdev(tests), 6) if len(tests) > 1 else None, "seeds": len(own)}
        window = [r["temporal"]["test"]["window_recall"]["Recall@10"] for r in own if r.get("temporal")]
        if window:
            summary[model]["test_window_recall@10"] = round(mean(window), 6)
    for place, model in enumerate(sorted(summary, key=lambda m: -summary[m]["test"]), start=1):
        summary[model]["rank"] = place
    return summary


def side_by_side(rankings: dict[str, dict[str, dict[str, Any]]]) -> str:
    def cell(entry: dict[str, Any] | None, key: str) -> str:
        if entry is None or entry.get(key) is None:
            return ""
        value = entry[key]
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    models = sorted(rankings["loo"], key=lambda m: rankings["loo"][m]["rank"])
    rows = [[model, cell(rankings["loo"].get(model), "test"), cell(rankings["loo"].get(model), "rank"),
             cell(rankings["temporal"].get(model), "test"), cell(rankings["temporal"].get(model), "rank"),
             cell(rankings["temporal"].get(model), "test_window_recall@10"),
             cell(rankings["loo"].get(model), "valid"), cell(rankings["temporal"].get(model), "valid")]
            for model in models]
    head = ["model", f"LOO test {METRIC}", "LOO rank", f"temporal test {METRIC}", "temporal rank",
            "temporal window Recall@10", f"LOO valid {METRIC}", f"temporal valid {METRIC}"]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offline.bench.quality.temporal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="prepared folder (with timestamps)")
    parser.add_argument("--work", type=Path, required=True, help="where the artifacts go (read back when there)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON (a .md table beside it)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=SEED, default=[42])
    parser.add_argument("--valid-cut", default=DEFAULT_VALID_CUT)
    parser.add_argument("--test-cut", default=DEFAULT_TEST_CUT)
    parser.add_argument("--refit", action="store_true", help="temporal runs refit before the test cut")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS),
                        help="train only these (e.g. the cheap temporal runs of new seeds first)")
    parser.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for every model (e.g. train.epochs=2 for a smoke run)")
    args = parser.parse_args(argv)
    configure_logging(logging.INFO)
    data = load_prepared(args.data)
    temporal = TemporalProtocol(args.valid_cut, args.test_cut, args.refit)
    started, load_before = time.time(), os.getloadavg()
    runs: list[dict[str, Any]] = []
    for protocol in args.protocols:
        chosen = temporal if protocol == "temporal" else None
        runs.append({"model": "popularity", "seed": None, "protocol": protocol, **popularity_run(data, chosen)})
        for config in args.configs:
            name = Path(config).stem
            for seed in args.seeds:
                out = args.work / protocol / name / f"seed{seed}"
                log.info("%s under %s, seed %d", name, protocol, seed)
                runs.append({"model": name, "seed": seed, "protocol": protocol, "config": config,
                             **retriever_run(config, seed, data, chosen, out, args.threads, args.override)})
    rankings = {protocol: ranking(runs, protocol) for protocol in PROTOCOLS}
    table = side_by_side(rankings) if set(args.protocols) == set(PROTOCOLS) else ""
    record = {
        "command": " ".join(["python -m offline.bench.quality.temporal", *(sys.argv[1:] if argv is None else argv)]),
        "data": dataset_fingerprint(data), "temporal": temporal.record(),
        "split": temporal.split_data(data).record(), "seeds": args.seeds, "metric": METRIC,
        "overrides": args.override,
        "seconds": round(time.time() - started, 1),
        "load_average": {"start": [round(v, 2) for v in load_before], "end": [round(v, 2) for v in os.getloadavg()]},
        "rankings": rankings, "table": table, "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
    atomic_write(args.out.with_suffix(".md"), lambda tmp: tmp.write_text(table + "\n"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
