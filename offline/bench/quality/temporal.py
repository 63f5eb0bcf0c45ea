"""`python -m offline.bench.quality.temporal`: the same models under leave-one-out and under the global temporal
split (offline/data/temporal.py), side by side, and how they rank under each (docs/temporal.md).

Every model is trained twice from its committed config, once per protocol, with `offline.jobs.train`'s own
`train_retriever` (the code `seqrec train` runs), and the popularity baseline is fitted per protocol as `seqrec
evaluate --model popularity` fits it. A run whose artifact is already in WORK is read back instead of retrained,
so seeds can be added by running the command again; the JSON says which runs were read back.

    python -m offline.bench.quality.temporal --data PREPARED --work /tmp/temporal-bench \
        --seeds 42 --out docs/results/temporal/ml-100k.json

The baselines are popularity and personal frequency (offline/evaluation/frequency.py: the user's own items first,
its decay chosen on validation, then popularity), each fitted per protocol. ``--two-stage FILE`` merges the
``rankings.{loo,temporal}.two-stage`` rows of another run's JSON (the same schema) into the rankings and the table;
``--tables-only`` rebuilds the rankings and the table from the runs already in ``--out``, training nothing.
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
from common.errors import SeqrecError
from offline.cli.common import SEED, configure_logging
from offline.data.prepared import PreparedDataset, dataset_fingerprint, load_prepared
from offline.data.temporal import DEFAULT_TEST_CUT, DEFAULT_VALID_CUT, TemporalProtocol, repeat_shares
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


def frequency_run(data: PreparedDataset, temporal: TemporalProtocol | None) -> dict[str, Any]:
    """The personal-frequency baseline's figures under a protocol (its decay and the repeat policy chosen on
    validation)."""
    from offline.evaluation.frequency import evaluate_frequency, evaluate_frequency_temporal

    if temporal is not None:
        result = evaluate_frequency_temporal(data, temporal, ks=EVAL_KS)
        return {key: result[key] for key in ("valid", "test", "temporal", "repeats", "decay", "valid_by_decay")}
    return evaluate_frequency(data, ks=EVAL_KS)


BASELINES = {"popularity": popularity_run, "personal-frequency": frequency_run}


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
    return ranked(summary)


def ranked(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``summary`` with each model's "rank" by its test mean: 1 + how many models are ahead, so equal means share
    a rank (1, 2, 3, 3); the models in that order (ties in the order given)."""
    order = sorted(summary, key=lambda m: -summary[m]["test"])
    for model in order:
        summary[model]["rank"] = 1 + sum(summary[other]["test"] > summary[model]["test"] for other in summary)
    return {model: summary[model] for model in order}


MERGED_KEYS = ("valid", "test", "test_std", "seeds")


def merge_rows(rankings: dict[str, dict[str, dict[str, Any]]], path: Path,
               model: str = "two-stage") -> dict[str, dict[str, dict[str, Any]]]:
    """``rankings`` with ``model``'s row of each protocol read from the JSON at ``path`` (its ``rankings``, the
    schema this bench writes), every protocol re-ranked. A protocol the file lacks stays as it was."""
    try:
        theirs = json.loads(path.read_text())["rankings"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SeqrecError(f"{path}: not a result JSON with 'rankings' ({error})") from error
    merged = {protocol: dict(rows) for protocol, rows in rankings.items()}
    found = False
    for protocol in PROTOCOLS:
        row = (theirs.get(protocol) or {}).get(model) if isinstance(theirs, dict) else None
        if row is None:
            continue
        missing = [key for key in MERGED_KEYS if key not in row]
        if missing or not isinstance(row["test"], (int, float)):
            raise SeqrecError(f"{path}: rankings.{protocol}.{model} lacks {', '.join(missing) or 'a numeric test'}")
        kept = {key: row[key] for key in (*MERGED_KEYS, "test_window_recall@10") if key in row}
        merged[protocol] = ranked({**{m: dict(r) for m, r in merged[protocol].items() if m != model},
                                   model: {**kept, "source": str(path)}})
        found = True
    if not found:
        raise SeqrecError(f"{path}: no rankings.loo.{model} nor rankings.temporal.{model}")
    return merged


def side_by_side(rankings: dict[str, dict[str, dict[str, Any]]]) -> str:
    def cell(entry: dict[str, Any] | None, key: str) -> str:
        if entry is None or entry.get(key) is None:
            return ""
        value = entry[key]
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    def place(model: str) -> tuple[int, int]:  # by the leave-one-out rank; a model only under temporal after
        loo, temporal = rankings["loo"].get(model), rankings["temporal"].get(model)
        return (loo["rank"] if loo else len(rankings["loo"]) + 1, temporal["rank"] if temporal else 0)

    listed = [*rankings["loo"], *(m for m in rankings["temporal"] if m not in rankings["loo"])]
    models = sorted(listed, key=place)  # stable: models of one rank keep the rankings' order
    rows = [[model, cell(rankings["loo"].get(model), "test"), cell(rankings["loo"].get(model), "rank"),
             cell(rankings["temporal"].get(model), "test"), cell(rankings["temporal"].get(model), "rank"),
             cell(rankings["temporal"].get(model), "test_window_recall@10"),
             cell(rankings["loo"].get(model), "valid"), cell(rankings["temporal"].get(model), "valid")]
            for model in models]
    head = ["model", f"LOO test {METRIC}", "LOO rank", f"temporal test {METRIC}", "temporal rank",
            "temporal window Recall@10", f"LOO valid {METRIC}", f"temporal valid {METRIC}"]
    return markdown_table(head, rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m offline.bench.quality.temporal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="prepared folder (with timestamps); not with --tables-only")
    parser.add_argument("--work", type=Path, help="where the artifacts go (read back when there)")
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
    parser.add_argument("--two-stage", type=Path, default=None, metavar="FILE",
                        help="merge the rankings.{loo,temporal}.two-stage rows of this result JSON into the tables")
    parser.add_argument("--tables-only", action="store_true",
                        help="rebuild the rankings and the table from the runs in --out (nothing is trained)")
    args = parser.parse_args(argv)
    if args.tables_only and args.data is not None:
        parser.error("--tables-only reads the runs in --out; drop --data")
    if not args.tables_only and (args.data is None or args.work is None):
        parser.error("--data and --work are required (unless --tables-only)")
    return args


def train_runs(args: argparse.Namespace, data: PreparedDataset, temporal: TemporalProtocol) -> list[dict[str, Any]]:
    """Every model under every protocol asked for: the baselines fitted, the retrievers trained or read back."""
    runs: list[dict[str, Any]] = []
    for protocol in args.protocols:
        chosen = temporal if protocol == "temporal" else None
        for baseline, fit in BASELINES.items():
            runs.append({"model": baseline, "seed": None, "protocol": protocol, **fit(data, chosen)})
        for config in args.configs:
            name = Path(config).stem
            for seed in args.seeds:
                out = args.work / protocol / name / f"seed{seed}"
                log.info("%s under %s, seed %d", name, protocol, seed)
                runs.append({"model": name, "seed": seed, "protocol": protocol, "config": config,
                             **retriever_run(config, seed, data, chosen, out, args.threads, args.override)})
    return runs


def with_tables(record: dict[str, Any], two_stage: Path | None) -> dict[str, Any]:
    """``record`` with its rankings (from its runs, plus the merged two-stage rows) and the side-by-side table."""
    rankings = {protocol: ranking(record["runs"], protocol) for protocol in PROTOCOLS}
    if two_stage is not None:
        rankings = merge_rows(rankings, two_stage)
    both = {run["protocol"] for run in record["runs"]} == set(PROTOCOLS)
    kept = {key: value for key, value in record.items() if key not in ("two_stage", "rankings", "table", "runs")}
    return {**kept, "two_stage": None if two_stage is None else str(two_stage), "rankings": rankings,
            "table": side_by_side(rankings) if both else "", "runs": record["runs"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(logging.INFO)
    command = " ".join(["python -m offline.bench.quality.temporal", *(sys.argv[1:] if argv is None else argv)])
    if args.tables_only:
        try:
            record = json.loads(args.out.read_text())
            record = {**record, "tables_command": command}
        except (OSError, ValueError) as error:
            raise SeqrecError(f"--tables-only: cannot read the runs of {args.out} ({error})") from error
    else:
        data = load_prepared(args.data)
        temporal = TemporalProtocol(args.valid_cut, args.test_cut, args.refit)
        started, load_before = time.time(), os.getloadavg()
        runs = train_runs(args, data, temporal)
        split = temporal.split_data(data)
        record = {
            "command": command, "data": dataset_fingerprint(data), "temporal": temporal.record(),
            "split": split.record(), "seeds": args.seeds, "metric": METRIC,
            "repeat_targets": {"loo": data.repeat_shares, "temporal": repeat_shares(split)},
            "overrides": args.override, "seconds": round(time.time() - started, 1),
            "load_average": {"start": [round(v, 2) for v in load_before],
                             "end": [round(v, 2) for v in os.getloadavg()]},
            "runs": runs,
        }
    record = with_tables(record, args.two_stage)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
    atomic_write(args.out.with_suffix(".md"), lambda tmp: tmp.write_text(record["table"] + "\n"))
    print(record["table"])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SeqrecError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
