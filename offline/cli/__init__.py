"""The `seqrec` command line.

Every subcommand has --help. Mistakes the user can fix (missing files, unknown columns,
malformed lines) print one line naming the file and line and exit non-zero; a traceback
appears only with --debug.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from retriever.errors import RetrieverError, SeqrecError, validation_message

log = logging.getLogger("seqrec")

Handler = Callable[[argparse.Namespace], int]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show full tracebacks and debug logs")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="only warnings and errors on stderr")
    return common


def _add_prepare(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from offline.data.readers import READERS

    p = sub.add_parser(
        "prepare", parents=[common], help="read a dataset and write the prepared folder",
        description="Read a dataset, sort each user's interactions by time (stable: equal timestamps keep "
        "the file's order), filter, map ids and write DIR/{manifest.json,sequences.parquet,items.parquet}.",
    )
    p.add_argument("--dataset", required=True, choices=sorted(READERS), help="dataset format")
    p.add_argument("--path", type=Path, help="file or folder with the source files")
    p.add_argument("--out", type=Path, required=True, help="prepared folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--download", action="store_true",
                   help="MovieLens only: fetch the official GroupLens zip and verify its MD5")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where downloads go (default $SEQREC_CACHE or ~/.cache/seqrec)")
    f = p.add_argument_group("filters")
    f.add_argument("--min-user-interactions", type=int, default=3, help="drop users with fewer (>= 3)")
    f.add_argument("--k-core", type=int, default=None, help="iteratively keep users and items with >= K")
    f.add_argument("--min-rating", type=float, default=None, help="drop interactions rated below this")
    t = p.add_argument_group("csv / parquet columns")
    t.add_argument("--user-col", default="user_id")
    t.add_argument("--item-col", default="item_id")
    t.add_argument("--time-col", default="timestamp", help="'' when the file has no clock (row order = time)")
    t.add_argument("--sep", default=",", help="field separator of CSV files (use '\\t' for TSV)")
    t.add_argument("--items-path", type=Path, default=None, help="optional item metadata file")
    s = p.add_argument_group("synthetic")
    s.add_argument("--n-users", type=int)
    s.add_argument("--n-items", type=int)
    s.add_argument("--mean-length", type=float)
    s.add_argument("--seed", type=int)
    p.set_defaults(handler=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> int:
    from offline.data.prepare import Filters, prepare_dataset
    from offline.data.readers import ReaderOptions

    synthetic = {
        name: getattr(args, name)
        for name in ("n_users", "n_items", "mean_length", "seed")
        if getattr(args, name) is not None
    }
    options = ReaderOptions(
        path=args.path, user_col=args.user_col, item_col=args.item_col, time_col=args.time_col or None,
        sep=args.sep.encode().decode("unicode_escape"), items_path=args.items_path, synthetic=synthetic,
    )
    filters = Filters(args.min_user_interactions, args.k_core, args.min_rating)
    manifest = prepare_dataset(args.dataset, args.out, options, filters, download=args.download,
                               cache_dir=args.cache_dir, overwrite=args.overwrite)
    print(
        f"prepared {manifest['source']}: {manifest['users']:,} users, {manifest['items']:,} items, "
        f"{manifest['interactions']:,} interactions -> {args.out}"
    )
    return 0


def _add_evaluate(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "evaluate", parents=[common], help="full-ranking evaluation on the leave-one-out split",
        description="Rank each user's validation and test target against every item (history excluded, "
        "ties counted against the target) and print JSON with 'valid' and 'test' metrics. With --artifact, "
        "'index' holds the same metrics computed from the artifact's FAISS index, as the service retrieves.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=["popularity"], help="a baseline fitted on the training positions")
    what.add_argument("--artifact", type=Path, help="a retriever artifact (from `seqrec train`)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--ks", default="1,5,10,20,50", help="cut-offs, comma separated")
    p.add_argument("--batch-size", type=int, default=None, help="users per batch (default: by memory)")
    p.add_argument("--no-index", action="store_true", help="skip the FAISS-index evaluation")
    p.add_argument("--stage", choices=["auto", "retriever", "two-stage"], default="auto",
                   help="with --artifact: the whole bundle (two-stage when it holds a ranker; the default) or the "
                   "retriever alone")
    p.add_argument("--depth", type=int, default=None,
                   help="two-stage: retriever candidates per user (default: the ranker's mining depth)")
    p.add_argument("--mask-ids", action="store_true",
                   help="two-stage: score every candidate as an unknown item (cold-start simulation)")
    p.set_defaults(handler=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.evaluation.evaluate import evaluate_splits

    ks = _parse_ks(args.ks)
    data = load_prepared(args.data)
    if args.artifact is not None and args.stage != "retriever":
        from offline.jobs.rank import evaluate_bundle
        from ranker.artifact import FOLDER

        if args.stage == "two-stage" or (args.artifact / FOLDER).exists():
            result = evaluate_bundle(args.artifact, data, stage="two-stage", depth=args.depth,
                                     mask_ids=args.mask_ids, ks=ks)
            print(json.dumps({"data": str(args.data), **result}, indent=2))
            return 0
    if args.artifact is not None:
        from offline.jobs.train import evaluate_artifact

        result = evaluate_artifact(args.artifact, data, ks=ks, use_index=not args.no_index,
                                   batch_size=args.batch_size)
        print(json.dumps({"data": str(args.data), **result}, indent=2))
        return 0
    from retriever.popularity import Popularity

    split = data.split()
    model = Popularity.fit(split.train.items, data.n_items)
    metrics = evaluate_splits(model.score, split, data.n_items, ks=ks, batch_size=args.batch_size)
    result = {"model": args.model, "data": str(args.data), "users": data.n_users, "items": data.n_items, **metrics}
    print(json.dumps(result, indent=2))
    return 0


def _add_train(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
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
    p.add_argument("--seed", type=int, default=None, help="shorthand for --train.seed")
    p.add_argument("--threads", type=int, default=None, help="shorthand for --train.threads (CPU)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="shorthand for --train.device")
    p.add_argument("--index", choices=["flat", "hnsw", "ivf"], default="flat", help="FAISS index to export")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel training on several processes (docs/SCALE.md); needs torchrun, e.g. "
                   "torchrun --nproc_per_node 2 -m offline.cli train --distributed ... (implied under torchrun)")
    p.set_defaults(handler=_run_train, overrides=True)


def _run_train(args: argparse.Namespace) -> int:
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
    if (args.out / "manifest.json").exists() and not args.resume:
        raise SeqrecError(f"{args.out} already holds an artifact; choose a new --out")
    if (args.out / "run" / "last.pt").exists() and not args.resume:
        raise SeqrecError(f"{args.out} holds an unfinished run; add --resume to continue it, or choose a new --out")
    data = load_prepared(args.data)
    manifest = train_retriever(config, data, args.out, resume=args.resume, index_spec=IndexSpec(kind=args.index),
                               dist=dist)
    if dist is not None and not dist.is_main:
        return 0
    summary = {"artifact": str(args.out), "version": manifest["version"], "training": manifest["training"],
               **manifest["metrics"]}
    print(json.dumps(summary, indent=2))
    return 0


def _add_export(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "export", parents=[common], help="rebuild an artifact's FAISS index (exact, HNSW or IVF)",
        description="Write the artifact's L2-normalised item vectors into a new FAISS index and update the "
        "manifest's checksum. Exact inner product (flat) by default; hnsw or ivf for large catalogues.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="retriever artifact folder")
    p.add_argument("--index", choices=["flat", "hnsw", "ivf", "auto"], default="flat",
                   help="auto: exact up to 200,000 items, else HNSW with the measured defaults (docs/SCALE.md); "
                   "the other options below then apply only when given")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW links per node")
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--ef-search", type=int, default=128)
    p.add_argument("--nlist", type=int, default=None, help="IVF lists (default about 4*sqrt(n_items))")
    p.add_argument("--nprobe", type=int, default=32, help="IVF lists searched per query")
    p.add_argument("--pq-m", type=int, default=None, help="IVF-PQ sub-quantizers (default: IVF-Flat)")
    p.add_argument("--gpu-shard", action="store_true",
                   help="on several GPUs, split the index across them instead of a full copy on each")
    p.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from retriever.artifact import rewrite_index
    from retriever.index import IndexSpec, spec_for_catalogue

    if args.index == "auto":
        manifest = json.loads((args.artifact / "manifest.json").read_text()) if (
            args.artifact / "manifest.json").is_file() else {}
        if "n_items" not in manifest:
            raise SeqrecError(f"{args.artifact} has no readable manifest.json with n_items")
        spec = replace(spec_for_catalogue(int(manifest["n_items"])), gpu_shard=args.gpu_shard)
    else:
        spec = IndexSpec(kind=args.index, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                         ef_search=args.ef_search, nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m,
                         gpu_shard=args.gpu_shard)
    manifest = rewrite_index(args.artifact, spec)
    print(f"exported {manifest['n_items']:,} items ({spec.kind}) -> {args.artifact / 'items.faiss'}")
    return 0


def _add_mine(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "mine", parents=[common], help="mine hard negatives from a retriever for the ranker",
        description="For each user's last --per-user training targets (training positions only) and for the "
        "validation and test targets, retrieve the top --depth items for the history before the target "
        "(history excluded) from the artifact's index. Writes OUT/{train,valid,test}.npz and OUT/mined.json "
        "with the retriever's recall@depth per split, the ceiling of the two-stage system.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="retriever artifact (bundle) folder")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the artifact was trained on")
    p.add_argument("--out", type=Path, required=True, help="folder for the mined groups")
    p.add_argument("--depth", type=int, default=100, help="candidates per group (N)")
    p.add_argument("--per-user", type=int, default=3, help="training targets per user (the most recent ones)")
    p.add_argument("--holdout", action="store_true",
                   help="mine the training groups with a sibling retriever trained without each user's last two "
                   "training items (kept in OUT/holdout-retriever), so they look like the validation and test groups")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.set_defaults(handler=_run_mine)


def _run_mine(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.jobs.rank import mine_to
    from offline.jobs.train import check_catalogue
    from retriever.artifact import load_artifact

    _threads(args.threads)
    data = load_prepared(args.data)
    artifact = load_artifact(args.artifact)
    check_catalogue(artifact, data)
    _, info, _ = mine_to(args.out, artifact, data, depth=args.depth, per_user=args.per_user, holdout=args.holdout)
    print(json.dumps({"out": str(args.out), **info}, indent=2))
    return 0


def _add_train_ranker(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "train-ranker", parents=[common], help="train the second stage on hard negatives and add it to the bundle",
        description="Mine hard negatives from the bundle's retriever (or reuse `seqrec mine` output), train an "
        "MLP (ID dropout, metadata) or LightGBM LambdaRank ranker on training positions, early-stop on "
        "validation NDCG@10 of the two-stage system, and write BUNDLE/ranker/ with its feature spec and the "
        "retriever version it was mined from.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="bundle folder (from `seqrec train`)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the bundle was trained on")
    p.add_argument("--kind", choices=["auto", "mlp", "lgbm"], default="auto",
                   help="ranker type; auto trains both and keeps the better on validation NDCG@10")
    p.add_argument("--mining", choices=["holdout", "direct"], default="holdout",
                   help="holdout: training groups mined by a sibling retriever that never saw their targets "
                   "(see `seqrec mine --help`); direct: by the bundle's own retriever (faster, over-confident)")
    p.add_argument("--mined", type=Path, default=None,
                   help="`seqrec mine` output to reuse, or where to mine to (default with holdout: BUNDLE.mining)")
    p.add_argument("--depth", type=int, default=100, help="candidates per group when mining (N)")
    p.add_argument("--per-user", type=int, default=3, help="training targets per user when mining")
    m = p.add_argument_group("MLP ranker")
    m.add_argument("--loss", choices=["listwise", "bce"], default="listwise", help="loss over each candidate group")
    m.add_argument("--id-dropout", type=float, default=0.3, help="probability of replacing an item's ID embedding")
    m.add_argument("--epochs", type=int, default=30)
    m.add_argument("--lr", type=float, default=1e-3)
    m.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.set_defaults(handler=_run_train_ranker)


def _run_train_ranker(args: argparse.Namespace) -> int:
    from offline.data.prepared import load_prepared
    from offline.jobs.rank import train_ranker

    _threads(args.threads)
    if not 0.0 <= args.id_dropout < 1.0:
        raise SeqrecError(f"--id-dropout must be in [0, 1), got {args.id_dropout}")
    data = load_prepared(args.data)
    mlp = {"loss": args.loss, "id_dropout": args.id_dropout, "epochs": args.epochs, "lr": args.lr, "seed": args.seed}
    manifest = train_ranker(args.artifact, data, kind=args.kind, depth=args.depth, per_user=args.per_user,
                            mined_dir=args.mined, holdout=args.mining == "holdout", mlp=mlp,
                            lgbm={"seed": args.seed})
    summary = {"artifact": str(args.artifact), "kind": manifest["kind"], "selection": manifest["selection"],
               "mining": manifest["mining"],
               "training_seconds": manifest["training"]["seconds"], **manifest["metrics"]}
    print(json.dumps(summary, indent=2))
    return 0


def _threads(n: int | None) -> None:
    if n is not None:
        if n < 1:
            raise SeqrecError(f"--threads must be >= 1, got {n}")
        import torch

        torch.set_num_threads(n)


def _add_serve(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve", parents=[common], help="serve recommendations over HTTP (POST /recommend; docs at /docs)",
        description="Start the HTTP service on the bundle ARTIFACTS/current names (or on a bundle folder). "
        "Every option falls back to its SEQREC_* environment variable (SEQREC_REDIS_URL, SEQREC_API_KEY, "
        "...; see service/settings.py); without a Redis URL, histories live in an in-process store.",
    )
    p.add_argument("--artifacts", type=Path, default=None, help="artifacts folder or bundle (SEQREC_ARTIFACTS)")
    p.add_argument("--host", default=None, help="interface to bind (SEQREC_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (SEQREC_PORT, default 8000)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (SEQREC_WORKERS, default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (SEQREC_THREADS)")
    p.add_argument("--redis-url", default=None, help="history store, e.g. redis://localhost:6379/0")
    p.add_argument("--max-batch", type=int, default=None, help="requests per forward pass (SEQREC_MAX_BATCH)")
    p.add_argument("--max-wait-ms", type=float, default=None, help="micro-batch wait (SEQREC_MAX_WAIT_MS)")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from service.app import create_app
    from service.bundle import BundleError, load_bundle, resolve_bundle
    from service.settings import Settings

    given = {name: getattr(args, name) for name in ("artifacts", "host", "port", "workers", "threads", "redis_url",
                                                    "max_batch", "max_wait_ms")}
    given = {name: value for name, value in given.items() if value is not None}
    try:
        settings = Settings(**given)  # options override SEQREC_* variables
    except ValidationError as err:
        raise SeqrecError("invalid settings: " + validation_message(err, prefix="SEQREC_", upper=True)) from None
    try:
        path = resolve_bundle(settings.artifacts)
        bundle = load_bundle(path) if settings.workers == 1 else None  # refuse a bad bundle before binding
    except BundleError as err:
        raise SeqrecError(str(err)) from None
    log.info("serving %s on http://%s:%d (docs at /docs)", path, settings.host, settings.port)
    if settings.workers == 1:
        uvicorn.run(create_app(settings, bundle=bundle), host=settings.host, port=settings.port,
                    log_level=settings.log_level)
    else:
        for name, value in given.items():  # worker processes read their settings from the environment
            os.environ[f"SEQREC_{name.upper()}"] = str(value)
        uvicorn.run("service.app:create_app", factory=True, workers=settings.workers, host=settings.host,
                    port=settings.port, log_level=settings.log_level)
    return 0


PIPELINES = Path(__file__).resolve().parents[2] / "configs" / "pipeline"


def _add_pipeline(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "pipeline", parents=[common], help="prepare, train, mine, train the ranker, evaluate and publish a bundle",
        description="Run the main job end to end from a pipeline config (configs/pipeline/*.yaml): prepare -> "
        "train retriever -> export index -> mine -> train ranker -> evaluate -> publish. Publishing moves the "
        "bundle into ARTIFACTS/versions/<version> and then switches ARTIFACTS/current atomically; a failing "
        "stage never touches current. Prints stage times and the retriever and two-stage metrics.",
        epilog="Roll out to a running service with `curl -X POST localhost:8000/admin/reload` (plus the API key).",
    )
    p.add_argument("--config", type=Path, default=os.environ.get("SEQREC_PIPELINE_CONFIG"),
                   help="pipeline YAML (default $SEQREC_PIPELINE_CONFIG)")
    p.add_argument("--out", type=Path, required=True, help="artifacts folder (versions/, current, work/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished run of this config (a new run when there is none)")
    p.add_argument("--keep", type=int, default=None, help="published versions to keep (default: the config's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for training")
    p.set_defaults(handler=_run_pipeline)


def _run_pipeline(args: argparse.Namespace) -> int:
    from offline.jobs.pipeline import run_pipeline, summary_table

    if args.config is None:
        raise SeqrecError("--config is required (or set SEQREC_PIPELINE_CONFIG); see configs/pipeline/")
    if args.keep is not None and args.keep < 1:
        raise SeqrecError(f"--keep must be >= 1, got {args.keep}")
    _threads(args.threads)
    summary = run_pipeline(args.config, args.out, resume=args.resume, keep=args.keep, threads=args.threads)
    print(summary_table(summary))
    return 0


def _add_demo(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo", parents=[common], help="the embedded default: run the pipeline on built-in data and serve it",
        description="Run `seqrec pipeline` on the built-in synthetic dataset (or, with --download, MovieLens-100K "
        "from GroupLens), then serve the published bundle with the in-process history store and print a "
        "curl example. Needs no data and no services.",
    )
    p.add_argument("--out", type=Path, default=Path("artifacts/demo"), help="artifacts folder")
    p.add_argument("--download", action="store_true", help="MovieLens-100K from GroupLens instead of synthetic")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-serve", action="store_true", help="stop after publishing")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for training")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from offline.jobs.pipeline import run_pipeline, summary_table
    from service.bundle import load_bundle

    _threads(args.threads)
    config = PIPELINES / ("ml-100k-download.yaml" if args.download else "demo.yaml")
    summary = run_pipeline(config, args.out, threads=args.threads)
    print(summary_table(summary))
    bundle = load_bundle(args.out / "current")
    history = [bundle.external(int(i)) for i in bundle.popular[:3]]
    body = json.dumps({"history": history, "k": 5})
    print(f"\ntry it:\n  curl -s http://{args.host}:{args.port}/recommend -H 'content-type: application/json' "
          f"-d '{body}'\n  (API docs: http://{args.host}:{args.port}/docs)\n", flush=True)
    if args.no_serve:
        return 0
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(artifacts=args.out, host=args.host, port=args.port, redis_url=None)
    uvicorn.run(create_app(settings, bundle=bundle), host=args.host, port=args.port, log_level="info")
    return 0


def _add_bench(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from offline.bench.models import add_bench_parser  # light at import: torch loads only when a bench runs

    add_bench_parser(sub, common)


def _add_analyze(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "analyze", parents=[common], help="HTML report: embedding geometry, head/tail and length breakdowns, "
        "readable predictions, training curves",
        description="Analyse a trained artifact (and others to compare, trained on the same catalogue) on a "
        "prepared dataset. Writes OUT/report.html, a PNG per figure and OUT/report.json with every number.",
    )
    p.add_argument("--artifact", type=Path, required=True, help="the artifact (bundle) to analyse")
    p.add_argument("--compare", type=Path, action="append", default=[], metavar="ARTIFACT",
                   help="another artifact to show side by side (repeatable)")
    p.add_argument("--data", type=Path, required=True, help="prepared folder the artifacts were trained on")
    p.add_argument("--out", type=Path, required=True, help="report folder (replaced as a whole)")
    p.add_argument("--k", type=int, default=10, help="neighbours for hubness (k-occurrence; default 10)")
    p.add_argument("--head-share", type=float, default=0.2,
                   help="head = the most popular items making up this share of training interactions (0.2)")
    p.add_argument("--length-edges", default=None,
                   help="history-length bucket upper bounds, e.g. 5,10,20,50 (default: quantile buckets)")
    p.add_argument("--length-buckets", type=int, default=5, help="quantile buckets when no --length-edges (5)")
    p.add_argument("--users", type=int, default=5, help="sample users for readable predictions (5)")
    p.add_argument("--user-ids", default=None, help="comma-separated user ids to show instead of a sample")
    p.add_argument("--tsne-items", type=int, default=2000, help="items in the t-SNE sample (2000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the user and t-SNE samples")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.set_defaults(handler=_run_analyze)


def _run_analyze(args: argparse.Namespace) -> int:
    from offline.analysis.analyze import run_analyze

    _threads(args.threads)
    return run_analyze(args)


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise SeqrecError(f"--ks must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise SeqrecError("--ks values must be >= 1")
    return ks


COMMANDS = (_add_prepare, _add_train, _add_export, _add_evaluate, _add_mine, _add_train_ranker, _add_pipeline,
            _add_demo, _add_serve, _add_bench, _add_analyze)


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="seqrec", parents=[common],
        description="seqrec: a two-stage sequential recommender (prepare data, train, evaluate, serve).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = getattr(args, "debug", False)
    level = logging.DEBUG if debug else logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    handler: Handler = args.handler
    try:
        if getattr(args, "overrides", False):
            from retriever.config import parse_cli_overrides

            args.extra = parse_cli_overrides(extra)
        return handler(args)
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `seqrec ... | head`: the reader went away; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:
        if debug:
            raise
        user_error = isinstance(err, SeqrecError | RetrieverError)
        kind = "error" if user_error else f"internal error ({type(err).__name__})"
        hint = "" if user_error else " (rerun with --debug for the traceback)"
        print(f"seqrec: {kind}: {err}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
