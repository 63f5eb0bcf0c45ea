"""`seqrec train`, `seqrec export` and `seqrec evaluate`: the retriever and its evaluation."""

from __future__ import annotations

import argparse
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from common.atomic import exclusive
from common.errors import SeqrecError
from common.folders import refuse_seqrec_folder
from offline.cli.common import SEED, Subparsers, at_least, parse_ks, print_json
from offline.cli.temporal import add_protocol_arguments, protocol_from, refuse_temporal_artifact
from retriever.repeats import REPEATS

if TYPE_CHECKING:
    from offline.data.prepared import PreparedDataset
    from offline.data.temporal import TemporalProtocol

TRAIN_LOCK = "train.lock"  # in OUT/run, held by the run writing OUT


def add_train_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "train", parents=[common], help="train a retriever and write its artifact",
        description="Train a sequence retriever on the training positions of a prepared dataset, early-stop "
        "on validation NDCG@10, evaluate the best epoch on valid and test, and write a self-describing "
        "artifact (weights, config, FAISS index, item ids, manifest with checksums) to --out. "
        "Any config key can be overridden: --train.lr 3e-4 --model.d_model 64 --loss.name full.",
        epilog="Training state for --resume and TensorBoard logs go to OUT/run (tensorboard --logdir OUT/run/tb).",
    )
    p.add_argument("--config", type=Path, default=None, help="YAML run config (default: built-in defaults)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    p.add_argument("--resume", action="store_true", help="continue from OUT/run/last.pt after an interruption")
    p.add_argument("--init-from", type=Path, default=None, metavar="BUNDLE",
                   help="warm start: begin from this bundle's weights (item rows carried over by external id, "
                   "new items initialised as from scratch; optimiser, schedule and early stopping fresh)")
    p.add_argument("--seed", type=SEED, default=None, help="shorthand for --train.seed")
    p.add_argument("--threads", type=int, default=None, help="shorthand for --train.threads (CPU)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="shorthand for --train.device")
    p.add_argument("--index", choices=["flat", "hnsw", "ivf"], default="flat", help="FAISS index to export")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel training on several processes (docs/SCALE.md); needs torchrun, e.g. "
                   "torchrun --nproc_per_node 2 -m offline.cli train --distributed ... (implied under torchrun)")
    add_protocol_arguments(p, refit=True)
    p.set_defaults(handler=_train, overrides=True)


def _train(args: argparse.Namespace) -> int:
    from retriever.distributed import ENV, Distributed

    dist = Distributed.from_env()
    if args.distributed and dist is None:
        raise SeqrecError(f"--distributed needs the {'/'.join(ENV)} variables that torchrun sets; launch with "
                          "`torchrun --nproc_per_node N -m offline.cli train ...`")
    if dist is not None and not dist.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 tells the story; the others only warn

    from offline.data.prepared import load_prepared
    from offline.jobs.train import train_retriever
    from retriever.config import load_config
    from retriever.index import IndexSpec

    overrides = list(args.extra)
    for flag, key in (("seed", "train.seed"), ("threads", "train.threads"), ("device", "train.device")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    config = load_config(args.config, overrides)
    temporal = protocol_from(args)
    _check_out(args.out, args.resume)  # before the lock creates OUT/run: a dataset's folder stays untouched
    # One run per --out: two would interleave their checkpoints and files. Rank 0 of a torchrun job holds the
    # lock for all its ranks, which share the folder.
    main = dist is None or dist.is_main
    def refusal(holder: str) -> str:
        return (f"{args.out}: another seqrec train writes into it ({holder}); wait for that run to end, or choose "
                "another --out")

    with exclusive(args.out / "run" / TRAIN_LOCK, refusal) if main else nullcontext():
        _check_out(args.out, args.resume)  # again under the lock: a run that ended meanwhile left its artifact
        data = load_prepared(args.data)
        manifest = train_retriever(config, data, args.out, resume=args.resume, index_spec=IndexSpec(kind=args.index),
                                   dist=dist, init_from=args.init_from, temporal=temporal)
    if not main:
        return 0
    summary = {"artifact": str(args.out), "version": manifest.version, "training": manifest.training,
               **manifest.metrics}
    print_json(summary)
    return 0


def _check_out(out: Path, resume: bool) -> None:
    """Refuse an --out that holds a dataset or a bundle (or lies inside a dataset), unless --resume continues the
    run whose checkpoint OUT/run/last.pt is: --resume without one trained from scratch over a published bundle
    or a prepared dataset."""
    unfinished = (out / "run" / "last.pt").exists()
    if resume and unfinished:
        return
    refuse_seqrec_folder(out)
    if unfinished:
        raise SeqrecError(f"{out} holds an unfinished run; add --resume to continue it, or choose a new --out")


def add_export_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "export", parents=[common], help="rebuild an artifact's FAISS index (exact, HNSW or IVF)",
        description="Write the artifact's item vectors (unit for cosine models, raw for dot-product ones) into a "
        "new FAISS index and update the manifest's checksum, in a staged copy that then replaces the folder, so a "
        "server reloading it never meets half an export. Exact inner product (flat) by default; hnsw or ivf for "
        "large catalogues.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="retriever artifact folder")
    p.add_argument("--index", choices=["flat", "hnsw", "ivf", "auto"], default="flat",
                   help="auto: exact up to 200,000 items, else HNSW with the measured defaults (docs/SCALE.md), "
                   "which the HNSW options below replace when given; an option of another kind is refused")
    p.add_argument("--hnsw-m", type=int, help="HNSW links per node (default 32)")
    p.add_argument("--ef-construction", type=int, help="HNSW (default 200)")
    p.add_argument("--ef-search", type=int, help="HNSW (default 128)")
    p.add_argument("--nlist", type=int, help="IVF lists (default about 4*sqrt(n_items))")
    p.add_argument("--nprobe", type=int, help="IVF lists searched per query (default 32)")
    p.add_argument("--pq-m", type=int, help="IVF-PQ sub-quantizers (default: IVF-Flat)")
    p.add_argument("--gpu-shard", action="store_true",
                   help="on several GPUs, split the index across them instead of a full copy on each")
    p.set_defaults(handler=_export)


# Each index kind's own options (their defaults: `retriever.index.IndexSpec`'s).
INDEX_OPTIONS: dict[str, tuple[str, ...]] = {"hnsw": ("hnsw_m", "ef_construction", "ef_search"),
                                             "ivf": ("nlist", "nprobe", "pq_m")}


def _export(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from retriever.artifact import ArtifactError, read_manifest, rewrite_index
    from retriever.index import IndexSpec, spec_for_catalogue
    from service.system.catalog import keeping_catalogue_changes

    given = {name: value for name in (*INDEX_OPTIONS["hnsw"], *INDEX_OPTIONS["ivf"])
             if (value := getattr(args, name)) is not None}
    if args.index == "auto":
        try:
            n_items = read_manifest(args.artifact).n_items
        except ArtifactError:
            raise SeqrecError(f"{args.artifact} has no readable manifest.json with n_items") from None
        spec, picked = spec_for_catalogue(n_items), f" (what --index auto picks for {n_items:,} items)"
    else:
        spec, picked = IndexSpec(kind=args.index), ""
    # an option of another kind of index was written into the manifest beside it ({'kind': 'flat', 'pq_m': 4})
    wrong = [name for name in given if name not in INDEX_OPTIONS.get(spec.kind, ())]
    if wrong:
        owner = "hnsw" if wrong[0] in INDEX_OPTIONS["hnsw"] else "ivf"
        raise SeqrecError(f"--{wrong[0].replace('_', '-')} applies to --index {owner}, not to --index {spec.kind}"
                          f"{picked}")
    spec = replace(spec, **given, gpu_shard=args.gpu_shard)
    manifest = rewrite_index(args.artifact, spec, swap=keeping_catalogue_changes)
    print(f"exported {manifest.n_items:,} items ({spec.kind}) -> {args.artifact / 'items.faiss'}")
    return 0


def add_evaluate_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "evaluate", parents=[common], help="full-ranking evaluation on the leave-one-out split",
        description="Rank each user's validation and test target against every item (history excluded, "
        "ties counted against the target) and print JSON with 'valid' and 'test' metrics. With --artifact, "
        "'index' holds the same metrics computed from the artifact's FAISS index, as the service retrieves. A bundle's "
        "catalogue journal (items retired and added through the admin routes) is applied, as the service applies it.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=["popularity", "personal-frequency"],
                      help="a baseline fitted on the training positions: popularity, or personal-frequency (the "
                      "user's own items by count or recency, its decay chosen on validation, then popularity)")
    what.add_argument("--artifact", type=Path, help="a retriever artifact (from `seqrec train`)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--ks", default="1,5,10,20,50", help="cut-offs, comma separated")
    p.add_argument("--batch-size", type=at_least(1), default=None, help="users per batch (default: by memory)")
    p.add_argument("--no-index", action="store_true", help="skip the FAISS-index evaluation")
    p.add_argument("--stage", choices=["auto", "retriever", "two-stage"], default="auto",
                   help="with --artifact: the whole bundle (two-stage when it holds a ranker; the default) or the "
                   "retriever alone")
    p.add_argument("--candidates", "--depth", dest="candidates", type=at_least(1), default=None,
                   help="two-stage: retriever candidates per user, the service's `candidates` (default: the depth "
                   "the ranker was mined, trained and selected at; a deeper one is measured here, never trained on)")
    p.add_argument("--mask-ids", action="store_true",
                   help="two-stage: score every candidate as an unknown item (cold-start simulation)")
    p.add_argument("--repeats", choices=list(REPEATS), default="auto",
                   help="without --artifact (a baseline): the repeat policy (retriever/repeats.py); "
                   "an artifact always follows the policy its manifest stores")
    add_protocol_arguments(p, refit=True)
    p.set_defaults(handler=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.evaluation.evaluate import evaluate_splits
    from ranker.artifact import FOLDER

    ks = parse_ks(args.ks)
    two_stage = args.artifact is not None and args.stage != "retriever" and (
        args.stage == "two-stage" or (args.artifact / FOLDER).exists())
    given = [flag for flag, on in (("--candidates", args.candidates is not None), ("--mask-ids", args.mask_ids),
                                   ("--stage two-stage", args.stage == "two-stage")) if on]
    if given and not two_stage:  # each was ignored without a word
        what = f"--model {args.model}" if args.artifact is None else (
            "--stage retriever" if args.stage == "retriever" else f"{args.artifact}, which holds no ranker")
        verb = "apply" if len(given) > 1 else "applies"
        raise SeqrecError(f"{' and '.join(given)} {verb} to a two-stage evaluation, not to {what}")
    temporal = protocol_from(args)
    if temporal is None and args.artifact is not None:
        refuse_temporal_artifact(args.artifact)
    data = load_prepared(args.data)
    if temporal is not None:
        return _evaluate_temporal(args, data, temporal, ks, two_stage)
    if two_stage:
        from offline.jobs.evaluate import evaluate_bundle

        result = evaluate_bundle(args.artifact, data, stage="two-stage", depth=args.candidates,
                                 mask_ids=args.mask_ids, ks=ks)
        print_json({"data": str(args.data), **result})
        return 0
    if args.artifact is not None:
        from offline.evaluation.retriever import evaluate_artifact
        from offline.jobs.evaluate import served_index_metrics

        result = evaluate_artifact(args.artifact, data, ks=ks, use_index=not args.no_index,
                                   batch_size=args.batch_size)
        served = None if args.no_index else served_index_metrics(args.artifact, data, ks)
        if served is not None:  # the catalogue journal applied, as the service retrieves
            result["index"].update(served)
        print_json({"data": str(args.data), **result})
        return 0
    if args.model == "personal-frequency":
        from offline.evaluation.frequency import evaluate_frequency

        frequency = evaluate_frequency(data, repeats=args.repeats, ks=ks, batch_size=args.batch_size)
        print_json({"model": args.model, "data": str(args.data), "users": data.n_users, "items": data.n_items,
                    "repeat_targets": data.repeat_shares, **frequency})
        return 0
    from retriever.popularity import Popularity
    from retriever.repeats import resolve_repeats

    split = data.split()
    model = Popularity.fit(split.train.items, data.n_items)
    repeats = resolve_repeats(args.repeats, data.repeat_shares["valid"])
    metrics = evaluate_splits(model.score, split, data.n_items, ks=ks, batch_size=args.batch_size,
                              exclude_seen=repeats == "exclude")
    result = {"model": args.model, "data": str(args.data), "users": data.n_users, "items": data.n_items,
              "repeats": repeats, "repeat_targets": data.repeat_shares, **metrics}
    print_json(result)
    return 0


def _evaluate_temporal(args: argparse.Namespace, data: PreparedDataset, temporal: TemporalProtocol, ks: tuple[int, ...],
                       two_stage: bool) -> int:
    """`seqrec evaluate --protocol temporal` (offline/evaluation/temporal.py)."""
    from offline.evaluation.temporal import evaluate_artifact_temporal, evaluate_popularity_temporal

    if two_stage:  # a bundle of `seqrec pipeline --protocol temporal` (offline/jobs/evaluate_temporal.py)
        from offline.jobs.evaluate_temporal import evaluate_bundle_temporal

        if args.candidates is not None or args.mask_ids or args.refit:
            raise SeqrecError("--protocol temporal scores a bundle as it was published, at its ranker's depth: "
                              "drop --candidates, --mask-ids and --refit")
        result = evaluate_bundle_temporal(args.artifact, data, temporal, ks=ks)
        print_json({"data": str(args.data), **result})
        return 0
    if args.artifact is not None:
        if args.refit:
            raise SeqrecError("--refit is a training choice: an artifact records it (`seqrec train --refit`) and "
                              "is evaluated under the protocol it was trained with; drop --refit here")
        result = evaluate_artifact_temporal(args.artifact, data, temporal, ks=ks, use_index=not args.no_index,
                                            batch_size=args.batch_size)
        print_json({"data": str(args.data), **result})
        return 0
    if args.model == "personal-frequency":
        from offline.evaluation.frequency import evaluate_frequency_temporal

        result = evaluate_frequency_temporal(data, temporal, repeats=args.repeats, ks=ks, batch_size=args.batch_size)
    else:
        result = evaluate_popularity_temporal(data, temporal, repeats=args.repeats, ks=ks,
                                              batch_size=args.batch_size)
    print_json({"model": args.model, "data": str(args.data), "users": data.n_users, "items": data.n_items,
                "protocol": temporal.record(), **result})
    return 0
