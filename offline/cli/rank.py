"""`seqrec mine` and `seqrec train-ranker`: the second stage. Their shared flags take their
defaults from `ranker.config` (RankerConfig, MLPConfig), the one place they are written."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from common.errors import SeqrecError, validation_message
from common.folders import refuse_seqrec_folder
from offline.cli.common import SEED, Subparsers, parse_names, print_json, set_threads
from offline.cli.temporal import refuse_temporal_retriever
from ranker.config import MINING, TRAINABLE_KINDS, RankerConfig, check_mlp_training, mlp_default, ranker_default


def _add_inputs(p: argparse.ArgumentParser, *, artifact_help: str, data_help: str) -> None:
    p.add_argument("--artifact", type=Path, required=True, help=artifact_help)
    p.add_argument("--data", type=Path, required=True, help=data_help)


def _add_group_size(p: argparse.ArgumentParser, *, depth_help: str, per_user_help: str) -> None:
    p.add_argument("--depth", type=int, default=ranker_default("depth"), help=depth_help)
    p.add_argument("--per-user", type=int, default=ranker_default("per_user"), help=per_user_help)


def _add_holdout_per_user(p: argparse.ArgumentParser) -> None:
    p.add_argument("--holdout-per-user", type=int, default=ranker_default("holdout_per_user"),
                   help="holdout mining: training items per user the holdout retriever never sees, each one a "
                   "training target (at least 2; --per-user counts for direct mining only)")


def add_mine_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "mine", parents=[common], help="mine hard negatives from a retriever for the ranker",
        description="For each user's last --per-user training targets (training positions only) and for the "
        "validation and test targets, retrieve the top --depth items for the history before the target "
        "(history excluded) from the artifact's index. Writes OUT/{train,valid,test}.npz and OUT/mined.json "
        "with the retriever's recall@depth per split, the ceiling of the two-stage system.",
    )
    _add_inputs(p, artifact_help="retriever artifact (bundle) folder",
                data_help="prepared folder the artifact was trained on")
    p.add_argument("--out", type=Path, required=True, help="folder for the mined groups")
    _add_group_size(p, depth_help="candidates per group (N)",
                    per_user_help="training targets per user (the most recent ones)")
    # Unlike train-ranker, mining alone is direct unless asked: a holdout retriever costs a training run.
    p.add_argument("--holdout", action="store_true",
                   help="mine the training groups with a sibling retriever trained without each user's last "
                   "--holdout-per-user training items (kept in OUT/holdout-retriever), so they look like the "
                   "validation and test groups")
    _add_holdout_per_user(p)
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.set_defaults(handler=_mine)


def _mine(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.evaluation.retriever import check_catalogue
    from offline.jobs.rank import mine_to
    from retriever.artifact import load_artifact

    set_threads(args.threads)
    try:
        config = RankerConfig(mining="holdout" if args.holdout else "direct", depth=args.depth,
                              per_user=args.per_user, holdout_per_user=args.holdout_per_user)
    except ValidationError as err:
        raise SeqrecError(validation_message(err)) from None
    refuse_seqrec_folder(args.out)
    refuse_temporal_retriever(args.artifact, "mine")
    data = load_prepared(args.data)
    artifact = load_artifact(args.artifact)
    check_catalogue(artifact, data)
    _, info, _ = mine_to(args.out, artifact, data, config)
    print_json({"out": str(args.out), **info})
    return 0


def add_train_ranker_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "train-ranker", parents=[common], help="train the second stage on hard negatives and add it to the bundle",
        description="Mine hard negatives from the bundle's retriever (or reuse `seqrec mine` output), train an "
        "MLP (ID dropout, metadata) or LightGBM LambdaRank ranker on training positions, early-stop on "
        "validation NDCG@10 of the two-stage system, and write BUNDLE/ranker/ with its feature spec and the "
        "retriever version it was mined from.",
    )
    _add_inputs(p, artifact_help="bundle folder (from `seqrec train`)",
                data_help="prepared folder the bundle was trained on")
    p.add_argument("--kind", choices=list(TRAINABLE_KINDS), default=ranker_default("kind"),
                   help="ranker type; auto trains both and keeps the better on validation NDCG@10")
    p.add_argument("--mining", choices=list(MINING), default=ranker_default("mining"),
                   help="holdout: training groups mined by a sibling retriever that never saw their targets "
                   "(see `seqrec mine --help`); direct: by the bundle's own retriever (faster, over-confident)")
    p.add_argument("--mined", type=Path, default=None,
                   help="`seqrec mine` output to reuse, or where to mine to (default with holdout: BUNDLE.mining, "
                   "named after the folder BUNDLE links to: ARTIFACTS/versions/<version>.mining for ARTIFACTS/current)")
    _add_group_size(p, depth_help="candidates per group when mining (N)",
                    per_user_help="training targets per user when mining directly")
    _add_holdout_per_user(p)
    c = p.add_argument_group("candidate sources and extra features")
    c.add_argument("--sources", type=parse_names, default=ranker_default("sources"),
                   help="comma-separated candidate sources: retriever (the FAISS list) and cooc (the item-to-item "
                   "co-occurrence list of ranker/cooc.py, merged into the same depth)")
    c.add_argument("--cooc-share", type=float, default=ranker_default("cooc_share"),
                   help="share of the depth's slots offered to the cooc source (the retriever keeps the rest)")
    c.add_argument("--features", type=parse_names, default=ranker_default("features"),
                   help="comma-separated extra ranker features (ranker/groups/): cooc_last1, cooc_last3, "
                   "cooc_last10, cooc_rank, popularity_trend; with timestamps, as of the request's time: "
                   "recent_30d, recent_7d, days_since_last, days_since_first, user_idle_days; from the "
                   "catalogue's metadata: meta_last, meta_recent; empty: the base features alone")
    m = p.add_argument_group("MLP ranker")
    m.add_argument("--loss", choices=["listwise", "bce"], default=mlp_default("loss"),
                   help="loss over each candidate group")
    m.add_argument("--id-dropout", type=float, default=mlp_default("id_dropout"),
                   help="probability of replacing an item's ID embedding")
    m.add_argument("--epochs", type=int, default=mlp_default("epochs"))
    m.add_argument("--lr", type=float, default=mlp_default("lr"))
    m.add_argument("--seed", type=SEED, default=mlp_default("seed"))
    m.add_argument("--members", type=int, default=ranker_default("members"),
                   help="networks trained from seeds --seed, --seed + 1, ... whose mean logit scores (an ensemble)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.set_defaults(handler=_train_ranker)


def _train_ranker(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.jobs.rank import train_ranker

    set_threads(args.threads)
    mlp = {"loss": args.loss, "id_dropout": args.id_dropout, "epochs": args.epochs, "lr": args.lr, "seed": args.seed}
    check_mlp_training({name: mlp[name] for name in ("id_dropout", "epochs", "lr")},  # now, not after mining
                       label=lambda name: "--" + name.replace("_", "-"))
    try:
        config = RankerConfig(kind=args.kind, mining=args.mining, depth=args.depth, per_user=args.per_user,
                              holdout_per_user=args.holdout_per_user, sources=args.sources,
                              cooc_share=args.cooc_share, features=args.features, members=args.members)
    except ValidationError as err:
        raise SeqrecError(validation_message(err)) from None
    if args.mined is not None:
        refuse_seqrec_folder(args.mined, "--mined")
    refuse_temporal_retriever(args.artifact, "train-ranker")
    data = load_prepared(args.data)
    manifest = train_ranker(args.artifact, data, config, mined_dir=args.mined, mlp=mlp, lgbm={"seed": args.seed})
    summary = {"artifact": str(args.artifact), "kind": manifest.kind, "selection": manifest.selection,
               "mining": manifest.mining, "training_seconds": (manifest.training or {})["seconds"],
               **manifest.metrics}
    print_json(summary)
    return 0
