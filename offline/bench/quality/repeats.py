"""One pipeline config run under each repeat policy, and the repeat shares of prepared folders.

    python -m offline.bench.quality.repeats --config configs/pipeline/demo.yaml --out docs/results/repeats \
        --work /tmp/repeats --threads 1 [--prepared /tmp/beauty /tmp/ml-100k]

For each policy (exclude, allow) the config runs end to end (`offline.jobs.pipeline.run_pipeline`)
with ``train.repeats`` set to it, and the published bundle's evaluation (retriever and two-stage,
validation and test, under that policy) is kept. OUT/<config name>.json holds every figure and the
data's repeat shares, OUT/<config name>.md the table; with --prepared, OUT/shares.json and
shares.md list each folder's share of repeat validation and test targets and the policy
``train.repeats: auto`` resolves to for it.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from offline.cli.common import LOG_FORMAT, configure_logging
from offline.tables import markdown_table
from retriever.repeats import resolve_repeats

log = logging.getLogger(__name__)
POLICIES = ("exclude", "allow")
METRICS = ("HR@10", "NDCG@10", "MRR@10")


def run_policies(config_path: Path, work: Path, threads: int | None) -> dict[str, Any]:
    """{"config": ..., "repeat_targets": ..., "auto": policy, "runs": {policy: evaluation}}."""
    from offline.jobs.pipeline import load_pipeline_config, run_pipeline

    config = load_pipeline_config(config_path)  # paths made absolute, so the copies may live anywhere
    runs: dict[str, Any] = {}
    for policy in POLICIES:
        folder = work / policy
        folder.mkdir(parents=True, exist_ok=True)
        raw = config.model_dump(mode="json")
        raw["overrides"] = {**raw["overrides"], "train.repeats": policy}
        copy = folder / "pipeline.yaml"
        copy.write_text(yaml.safe_dump(raw, sort_keys=False))
        log.info("%s under repeats: %s -> %s", config_path, policy, folder)
        summary = run_pipeline(copy, folder / "artifacts", threads=threads)
        runs[policy] = summary.evaluation
    shares = runs[POLICIES[0]]["repeat_targets"]
    return {"config": str(config_path), "repeat_targets": shares, "auto": resolve_repeats("auto", shares["valid"]),
            "runs": runs}


def policy_table(result: dict[str, Any]) -> str:
    rows = []
    for policy, ev in result["runs"].items():
        for system, key in (("retriever", "retriever_{}"), (ev.get("system", "two-stage"), "{}")):
            for split in ("valid", "test"):
                metrics = ev.get(key.format(split))
                if metrics is not None:
                    rows.append((policy, f"{system} (depth {ev['depth']})" if system == "two-stage" else system,
                                 split, *(f"{metrics[m]:.4f}" for m in METRICS)))
    shares = result["repeat_targets"]
    note = (f"Repeat targets: {shares['valid']:.1%} of validation, {shares['test']:.1%} of test; "
            f"`train.repeats: auto` picks {result['auto']}.")
    return "\n".join([markdown_table(("repeats", "system", "split", *METRICS), rows), "", note])


def share_rows(folders: list[Path]) -> list[dict[str, Any]]:
    from offline.data.prepared import load_prepared

    out = []
    for folder in folders:
        data = load_prepared(folder)
        shares = data.repeat_shares
        out.append({"data": str(folder), "source": data.manifest.get("source"), "users": data.n_users,
                    "repeat_targets": shares, "auto": resolve_repeats("auto", shares["valid"])})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="pipeline config to run under each policy")
    parser.add_argument("--out", type=Path, required=True, help="folder for the result files")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seqrec-repeats"), help="artifacts of the runs")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prepared", type=Path, nargs="*", default=[], help="prepared folders to report shares of")
    args = parser.parse_args(argv)
    configure_logging(logging.INFO, fmt="%(asctime)s " + LOG_FORMAT)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.config is not None:
        result = run_policies(args.config, args.work, args.threads)
        name = args.config.stem
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / f"{name}.md").write_text(policy_table(result) + "\n")
        print(policy_table(result))
    if args.prepared:
        rows = share_rows(args.prepared)
        (args.out / "shares.json").write_text(json.dumps(rows, indent=2) + "\n")
        table = markdown_table(("data", "users", "valid repeats", "test repeats", "auto"),
                               [(Path(r["data"]).name, r["users"], f"{r['repeat_targets']['valid']:.2%}",
                                 f"{r['repeat_targets']['test']:.2%}", r["auto"]) for r in rows])
        (args.out / "shares.md").write_text(table + "\n")
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
