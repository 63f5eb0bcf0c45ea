"""`seqrec bench two-stage`: the ranker tables (retriever alone, + MLP, + LightGBM, MLP with IDs masked).

    seqrec bench two-stage --artifact runs/ml-100k/seed42 --artifact runs/ml-100k/seed123 \
        --data data/ml-100k --out docs/results/two-stage/ml-100k --work runs/two-stage-ml-100k

Each ``--artifact`` is a trained retriever (a `seqrec train`, `seqrec bench` or pipeline bundle;
any ranker in it is ignored). Per retriever, under WORK/seed<seed>/ (``--work``, default OUT/runs):
``retriever/`` is a copy of it, ``mining/`` the holdout-mined groups (its holdout retriever trained
once and shared), and ``mlp/`` and ``lgbm/`` two copies that each get one ranker
(`offline.jobs.rank.train_ranker`, the defaults of `seqrec train-ranker`). Every figure is the
bundles' own evaluation: the retriever's full-ranking metrics, the two-stage metrics in the served
order at the mining depth, the MLP's with every item ID masked, and the retriever's recall at that
depth. The row `--kind auto` would ship is the ranker with the higher validation NDCG@10. A rerun
reuses what is finished; OUT/results.{json,md} cover every finished seed under WORK.

``--holdout-only --config C --seeds S,...`` trains only the holdout retrievers (from the YAML config,
as the bench of retrievers resolves it), so they can train while the retrievers themselves do; a
later run with ``--artifact`` reuses them when the configs agree. ``--holdout-per-user N`` mines with
holdout retrievers that never saw each user's last N training items (`RankerConfig.holdout_per_user`).
``--features a,b`` trains both rankers with those extra features (`ranker.groups`; a separate ``--work``,
whose ``seed<seed>/mining`` may be a copy of another work folder's: the groups do not depend on features).
``--mlp-members K`` makes the MLP ranker an ensemble of K networks (`MLPConfig.members`) and
``--mlp-id-dropout P`` trains it with that ID dropout (`MLPConfig.id_dropout`); each a separate ``--work``
as with ``--features``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.atomic import atomic_write
from common.errors import SeqrecError, validation_message
from offline.bench.lib.args import parse_ints
from offline.data.prepared import PreparedDataset, load_prepared
from offline.jobs.train import host_numerics
from offline.tables import markdown_table
from ranker.config import HOLDOUT_PER_USER, HOLDOUT_STOP_SHARE, RankerConfig, mlp_default
from retriever.artifact import load_artifact
from retriever.repeats import LEGACY_REPEATS

log = logging.getLogger(__name__)

KINDS = ("mlp", "lgbm")
ID_DROPOUT: float = mlp_default("id_dropout")
LEGACY_ID_DROPOUT = 0.3  # what the MLP of a record written before --mlp-id-dropout trained with
# 2: the MLP's input scaling is fitted on its training inputs (ID dropout included); a record without
# the key comes from before that fix (`ranker.train.fit_mlp`) and is not reused nor averaged with newer ones
MLP_SCALING = 2
ROWS = (("retriever", "retriever alone"), ("mlp", "retriever + MLP ranker"), ("lgbm", "retriever + LightGBM ranker"),
        ("mlp_ids_masked", "MLP ranker, all item IDs masked (cold-start simulation)"))
METRICS = (("test", "HR@10"), ("test", "NDCG@10"), ("valid", "NDCG@10"))


def ranker_settings(record: dict[str, Any]) -> dict[str, Any]:
    """How a record's rankers were trained beyond the mining: the keys two seeds must share to be averaged
    (a record written before a key existed reads as what it trained with then)."""
    return {"features": record.get("features", []), "mlp_members": record.get("mlp_members", 1),
            "mlp_id_dropout": record.get("mlp_id_dropout", LEGACY_ID_DROPOUT),
            "mlp_scaling": record.get("mlp_scaling", 1)}


def run_seed(artifact_path: Path, data: PreparedDataset, work: Path, config: RankerConfig,
             id_dropout: float = ID_DROPOUT) -> dict[str, Any]:
    """Train both rankers on one retriever (reusing what WORK already holds); its record."""
    artifact = load_artifact(artifact_path, with_index=False)
    seed = artifact.config.train.seed
    folder = work / f"seed{seed}"
    record_path = folder / "record.json"
    settings = {"features": list(config.features), "mlp_members": config.members, "mlp_id_dropout": id_dropout,
                "mlp_scaling": MLP_SCALING}
    if record_path.exists():
        record: dict[str, Any] = json.loads(record_path.read_text())
        if record.get("mlp_scaling", 1) != MLP_SCALING:
            raise SeqrecError(f"{folder} holds seed {seed} ranked before the MLP input-scaling fix; choose "
                              f"another --work (its mining folder may be copied there)")
        if (record["retriever_version"] == artifact.manifest.version and record["depth"] == config.depth
                and record["mining"].get("per_user", HOLDOUT_PER_USER) == config.holdout_per_user
                and ranker_settings(record) == settings):
            return record
        raise SeqrecError(f"{folder} holds seed {seed} of another retriever, depth, --holdout-per-user, "
                          f"--features, --mlp-members or --mlp-id-dropout; choose another --work")
    from offline.jobs.rank import train_ranker

    retriever = folder / "retriever"
    if not (retriever / "manifest.json").exists():
        shutil.rmtree(retriever, ignore_errors=True)
        shutil.copytree(artifact_path, retriever, ignore=shutil.ignore_patterns("ranker", "run"))
    rankers = {}
    for kind in KINDS:
        bundle = folder / kind
        if not (bundle / "ranker" / "manifest.json").exists():
            shutil.rmtree(bundle, ignore_errors=True)
            shutil.copytree(retriever, bundle)
            log.info("seed %d: %s ranker", seed, kind)
            train_ranker(bundle, data, config.model_copy(update={"kind": kind}), mined_dir=folder / "mining",
                         mlp={"id_dropout": id_dropout})
        rankers[kind] = json.loads((bundle / "ranker" / "manifest.json").read_text())
    record = seed_record(load_artifact(retriever, with_index=False).manifest.to_dict(), rankers, config.depth)
    record.update(seed=seed, artifact=str(artifact_path), retriever_version=artifact.manifest.version,
                  host=host_numerics(), **settings)
    atomic_write(record_path, lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))
    return record


def seed_record(retriever: dict[str, Any], rankers: dict[str, dict[str, Any]], depth: int) -> dict[str, Any]:
    """One seed's rows (split -> metrics), read from the retriever's and the rankers' manifests."""
    mlp, lgbm = rankers["mlp"], rankers["lgbm"]
    mining = lgbm["mining"]
    if mining["depth"] != depth or mlp["mining"] != mining:
        raise SeqrecError("the two rankers of one seed were not trained on the same mined groups")
    recall = mining[f"recall@{depth}"]
    rows = {"retriever": {s: retriever["metrics"][s] for s in ("valid", "test")},
            "mlp": {s: mlp["metrics"][s] for s in ("valid", "test")},
            "lgbm": {s: lgbm["metrics"][s] for s in ("valid", "test")},
            "mlp_ids_masked": mlp["metrics"]["ids_masked"],
            f"recall@{depth}": {s: {f"recall@{depth}": recall[s]} for s in ("valid", "test")}}
    auto = max(KINDS, key=lambda k: rows[k]["valid"]["NDCG@10"])
    record = {"depth": depth, "repeats": retriever.get("repeats", LEGACY_REPEATS),
              "repeat_targets": retriever.get("repeat_targets"),
              "mining": mining, "auto_choice": auto, "rows": rows}
    digest = lgbm.get("config", {}).get("inputs_sha256")
    if digest:  # rankers trained before the digest existed have none
        record["lgbm_inputs_sha256"] = digest
    return record


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarize_seeds(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sample std (n - 1) over seeds of every row, split and metric."""
    depth = records[0]["depth"]
    settings = ranker_settings(records[0])
    if any(r["depth"] != depth or r["repeats"] != records[0]["repeats"] or ranker_settings(r) != settings
           for r in records):
        raise SeqrecError("the seeds under OUT/runs differ in candidate depth, repeat policy, extra features, "
                          "MLP members, MLP ID dropout or MLP input scaling (before or after its fix)")
    names = [name for name, _ in ROWS] + [f"recall@{depth}"]
    rows: dict[str, Any] = {}
    for name in names:
        rows[name] = {}
        for split in ("valid", "test"):
            keys = [k for k, v in records[0]["rows"][name][split].items() if isinstance(v, float | int)]
            rows[name][split] = {k: _mean_std([float(r["rows"][name][split][k]) for r in records]) for k in keys}
    return {"seeds": [r["seed"] for r in records], "depth": depth, "features": settings["features"],
            "mlp_members": settings["mlp_members"], "mlp_id_dropout": settings["mlp_id_dropout"],
            "repeats": records[0]["repeats"],
            "repeat_targets": records[0]["repeat_targets"], "auto_choice": [r["auto_choice"] for r in records],
            "rows": rows}


def _cell(stat: dict[str, float], n: int) -> str:
    return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if n > 1 else f"{stat['mean']:.4f}"


def results_table(summary: dict[str, Any]) -> str:
    n, depth, rows = len(summary["seeds"]), summary["depth"], summary["rows"]
    base = rows["retriever"]["test"]["NDCG@10"]["mean"]
    lines = []
    for name, label in ROWS:
        cells = [_cell(rows[name][split][metric], n) for split, metric in METRICS]
        lines.append((label, *cells, f"{rows[name]['test']['NDCG@10']['mean'] / base:.2f}x"))
    recall = rows[f"recall@{depth}"]
    lines.append((f"retriever recall@{depth} (the two-stage ceiling)", _cell(recall["test"][f"recall@{depth}"], n),
                  "", f"{_cell(recall['valid'][f'recall@{depth}'], n)} (valid)", ""))
    head = ("method", "test HR@10", "test NDCG@10", "valid NDCG@10", "vs retriever (test NDCG@10, means)")
    return markdown_table(head, lines)


def write_results(out: Path, records: list[dict[str, Any]], command: str) -> dict[str, Any]:
    summary = summarize_seeds(records)
    shares = summary["repeat_targets"] or {}
    held = records[0].get("mining", {}).get("per_user", HOLDOUT_PER_USER)
    early = "second-to-last training item" if held == 2 else f"training item {held} from the end"
    extras = f" plus the extra features {', '.join(summary['features'])}" if summary["features"] else ""
    if summary["mlp_members"] > 1:
        extras += f", the MLP an ensemble of {summary['mlp_members']} networks (mean logit)"
    if summary["mlp_id_dropout"] != ID_DROPOUT:
        extras += f", the MLP's ID dropout {summary['mlp_id_dropout']}"
    text = "\n".join([
        f"# Two-stage results: {len(records)} seed(s) {', '.join(map(str, summary['seeds']))}", "",
        f"Full ranking over all items, pessimistic ties, leave-one-out (test = last item, validation = the one "
        f"before). Repeat policy `{summary['repeats']}` (repeat targets: {shares.get('valid', 0):.1%} of "
        f"validation, {shares.get('test', 0):.1%} of test). Candidate depth {summary['depth']}: the retriever's "
        f"top {summary['depth']} (FAISS index) are re-ranked and a target outside them is a miss. Rankers: "
        f"holdout mining ({held} training targets per user from a sibling retriever that never saw them; it "
        f"early-stops on {HOLDOUT_STOP_SHARE:.0%} of users, whose {early} is then no "
        f"ranker target), `seqrec train-ranker` defaults{extras}, epoch / boosting round chosen on validation. "
        f"Cells: mean ± sample std over seeds (one seed: the value). `--kind auto` picks per seed: "
        f"{', '.join(summary['auto_choice'])}.", "",
        results_table(summary), "", f"Reproduce: `{command}`", ""])
    result = {"command": command, **summary, "per_seed": records}
    out.mkdir(parents=True, exist_ok=True)  # with --work, nothing else has made OUT yet
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(result, indent=2) + "\n"))
    atomic_write(out / "results.md", lambda p: p.write_text(text))
    return result


def finished_records(work: Path) -> list[dict[str, Any]]:
    paths = sorted(work.glob("seed*/record.json"), key=lambda p: int(p.parent.name[4:]))
    return [json.loads(p.read_text()) for p in paths]


def train_holdouts(config_path: Path, seeds: list[int], data: PreparedDataset, work: Path,
                   overrides: list[str], per_user: int = HOLDOUT_PER_USER) -> None:
    """The holdout retrievers alone, from the YAML config (see the module docstring)."""
    from offline.jobs.holdout import holdout_folder, train_holdout_retriever
    from retriever.config import load_config
    from retriever.repeats import resolve_repeats

    for seed in seeds:
        config = load_config(config_path, [*overrides, f"train.seed={seed}"])
        repeats = resolve_repeats(config.train.repeats, data.repeat_shares["valid"])
        train_holdout_retriever(config, repeats, data, work / f"seed{seed}" / "mining" / holdout_folder(per_user),
                                per_user)


def command_line(args: argparse.Namespace) -> str:
    parts = ["seqrec bench two-stage", *(f"--artifact {a}" for a in args.artifact), f"--data {args.data}",
             f"--out {args.out}", f"--work {args.work}", f"--depth {args.depth}"]
    if args.holdout_per_user != HOLDOUT_PER_USER:
        parts.append(f"--holdout-per-user {args.holdout_per_user}")
    if args.features:
        parts.append(f"--features {','.join(args.features)}")
    if args.mlp_members != 1:
        parts.append(f"--mlp-members {args.mlp_members}")
    if args.mlp_id_dropout != ID_DROPOUT:
        parts.append(f"--mlp-id-dropout {args.mlp_id_dropout}")
    return " ".join(parts + ([f"--threads {args.threads}"] if args.threads else []))


def run_two_stage(args: argparse.Namespace) -> int:
    from offline.cli.common import set_threads

    set_threads(args.threads)
    if args.holdout_per_user < 2:
        raise SeqrecError(f"--holdout-per-user must be at least 2, got {args.holdout_per_user}")
    data = load_prepared(args.data)
    args.work = args.work or args.out / "runs"
    if args.holdout_only:
        if args.config is None or not args.seeds:
            raise SeqrecError("--holdout-only needs --config and --seeds")
        overrides = [f"train.threads={args.threads}"] if args.threads else []
        train_holdouts(args.config, parse_ints(args.seeds, "--seeds"), data, args.work, overrides,
                       args.holdout_per_user)
        return 0
    if not args.artifact:
        raise SeqrecError("give one --artifact per seed (trained retrievers), or --holdout-only")
    if args.seeds:  # it was ignored: each --artifact's seed is the one its retriever was trained with
        raise SeqrecError("--seeds goes with --holdout-only; with --artifact, each bundle's training seed counts")
    from offline.jobs.rank import checked_config

    try:
        config = checked_config(RankerConfig(depth=args.depth, holdout_per_user=args.holdout_per_user,
                                             features=args.features, members=args.mlp_members))
    except ValidationError as err:
        raise SeqrecError(validation_message(err)) from None
    if not 0.0 <= args.mlp_id_dropout < 1.0:
        raise SeqrecError(f"--mlp-id-dropout must be in [0, 1), got {args.mlp_id_dropout}")
    for path in args.artifact:
        run_seed(path, data, args.work, config, args.mlp_id_dropout)
    result = write_results(args.out, finished_records(args.work), command_line(args))
    print(results_table(result))
    return 0
