"""`seqrec bench ...`: the command group of the benchmarks, one small builder per subcommand.

Light at import: each handler imports its bench (torch, faiss, matplotlib, the load client) only
when it runs, so `seqrec --help` stays fast. The flags several subcommands share are added by the
``_add_*`` helpers below, so a shared flag is spelt, defaulted and documented once.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable
from pathlib import Path

from offline.cli.common import SEED, at_least, default_configs_dir, parse_names
from ranker.config import mlp_default, ranker_default

SubParsers = argparse._SubParsersAction  # argparse exposes no public name for it
DEVICES = ["auto", "cpu", "cuda"]


# --------------------------------------------------------------------------- shared flags


def _add_config_lookup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs-dir", type=Path, default=default_configs_dir(),
                   help="where <dataset>/<model>.yaml live (default: ./configs, else the configs seqrec ships)")
    p.add_argument("--dataset-name", default=None, help="config folder to use (default: the --data folder's name)")


def _add_set(p: argparse.ArgumentParser, help_text: str = "config override (repeatable)") -> None:
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help=help_text)


def _add_shorthands(p: argparse.ArgumentParser) -> None:
    """--threads and --device: shorthands for the train.threads and train.device overrides."""
    p.add_argument("--threads", type=int, default=None, help="shorthand for --set train.threads=N")
    p.add_argument("--device", choices=DEVICES, default=None, help="shorthand for train.device")


def _add_load_window(p: argparse.ArgumentParser, *, duration_help: str, warmup_help: str) -> None:
    """The open-loop load's measured seconds and the warm-up before them."""
    p.add_argument("--duration", type=at_least(0, float, strict=True), default=10.0, help=duration_help)
    p.add_argument("--warmup", type=at_least(0, float), default=2.0, help=warmup_help)


def _add_bodies(p: argparse.ArgumentParser, *, min_len: int, max_len: int, what: str) -> None:
    """The load's distinct request bodies and their history lengths (``what``: "history", "request history")."""
    p.add_argument("--requests", type=at_least(1), default=500, help="distinct request bodies")
    p.add_argument("--min-len", type=at_least(1), default=min_len, help=f"shortest {what}")
    p.add_argument("--max-len", type=at_least(1), default=max_len, help=f"longest {what}")


def _add_seed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=SEED, default=0)


# --------------------------------------------------------------------------- subcommands


def add_bench_parser(sub: SubParsers, common: argparse.ArgumentParser) -> None:
    """`seqrec bench` (train and evaluate models over seeds) and its tools: merge, latency, serve, index, scale,
    parity."""
    p = sub.add_parser(
        "bench", parents=[common], help="train and evaluate several backbones over seeds; write the tables",
        description="Train every model with its committed config (CONFIGS_DIR/<dataset>/<model>.yaml) once per "
        "seed, evaluate valid and test with full ranking, measure parameters, FLOPs and speed, and write "
        "OUT/results.{md,json,csv}: mean ± std over seeds. Runs go to OUT/runs/<model>/seed<seed>; "
        "rerunning skips finished runs and resumes interrupted ones; a failing run gets an error row (the other "
        "runs still finish) and makes the exit status 1.",
        epilog="`seqrec bench latency --help`: forward latency and throughput against sequence length.",
    )
    p.add_argument("--data", type=Path, help="prepared folder (from `seqrec prepare`)")
    p.add_argument("--models", help="comma-separated config names (e.g. sasrec,transformer) or YAML paths")
    p.add_argument("--seeds", default="42,123,2023", help="comma-separated training seeds")
    p.add_argument("--out", type=Path, help="folder for the tables and runs")
    _add_config_lookup(p)
    p.add_argument("--max-epochs", type=int, default=None, help="cap train.epochs (quick comparisons)")
    p.add_argument("--budget-minutes", type=at_least(0, float, strict=True), default=None,
                   help="wall-clock cap per run: stop after the epoch that crosses it, keep the best epoch")
    p.add_argument("--infer-batch", type=int, default=256, help="test users per timed inference batch")
    _add_set(p, "config override for every model (repeatable), e.g. --set train.patience=5")
    _add_shorthands(p)
    p.set_defaults(handler=_run_bench)
    tools = p.add_subparsers(dest="bench_tool",
                             metavar="{latency,serve,index,merge,scale,parity,two-stage,seen-set,journal,redis-wait,"
                                     "cluster-failover,hardening}",
                             required=False)
    for add in (_add_merge, _add_latency, _add_serve, _add_index, _add_scale, _add_parity, _add_two_stage,
                _add_seen_set, _add_journal, _add_redis_wait, _add_cluster_failover, _add_hardening):
        add(tools, common)


def _add_merge(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    merge = tools.add_parser(
        "merge", parents=[common], help="one table from several bench outputs on the same data",
        description="Read the per-run records of several `seqrec bench` outputs (same dataset and limits; "
        "each (model, seed) once) and write OUT/results.{md,json,csv} from them, nothing retrained.",
    )
    merge.add_argument("--from", dest="sources", type=Path, action="append", required=True,
                       help="a bench --out folder or its results.json (repeatable; models keep this order)")
    merge.add_argument("--out", type=Path, required=True, help="folder for the merged tables")
    merge.add_argument("--remark", action="append", help="a paragraph for the table's text (repeatable)")
    merge.add_argument("--min-seeds", type=int, default=0,
                       help="keep only models with at least this many finished seeds (complete rows)")
    merge.add_argument("--models", default=None,
                       help="comma-separated: only these models' runs (e.g. to keep unfinished rows apart)")
    merge.set_defaults(handler=_run_merge)


def _add_latency(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    lat = tools.add_parser(
        "latency", parents=[common], help="forward latency and throughput against sequence length",
        description="Build each model from its config with max_len set to the longest length and randomly "
        "initialised weights (latency does not depend on training), time the inference forward (user "
        "vectors; median of --reps after --warmup, inference mode) of a batch of random histories at each "
        "length, fit the log-log slope alpha, and write OUT/latency.{json,md,png}.",
    )
    lat.add_argument("--models", required=True, help="comma-separated config names or YAML paths")
    lat.add_argument("--lengths", default="64,128,256,512,1024,1536", help="comma-separated sequence lengths")
    lat.add_argument("--batch", type=at_least(1), default=32, help="sequences per timed batch")
    lat.add_argument("--out", type=Path, required=True, help="folder for latency.{json,md,png}")
    lat.add_argument("--data", type=Path, default=None,
                     help="prepared folder: catalogue size and default dataset name (optional)")
    _add_config_lookup(lat)
    lat.add_argument("--n-items", type=at_least(2), default=10_000, help="catalogue size without --data")
    lat.add_argument("--reps", type=at_least(1), default=10, help="timed repetitions per length")
    lat.add_argument("--warmup", type=at_least(0), default=3, help="untimed repetitions per length")
    _add_set(lat)
    _add_shorthands(lat)
    lat.set_defaults(handler=_run_latency)


def _add_serve(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    srv = tools.add_parser(
        "serve", parents=[common], help="open-loop HTTP load against the service and a no-op FastAPI app",
        description="Start the service (one uvicorn process per bundle) and a no-op FastAPI app, offer each "
        "the same request bodies at fixed open-loop rates (latency counted from each request's due time), "
        "and write OUT/serve.{json,md}: p99 at --check-rate, the highest rate held with p99 <= 50 ms and 0 "
        "errors, and its ratio to the no-op app's.",
    )
    srv.add_argument("--artifact", type=Path, action="append", required=True,
                     help="bundle to serve (repeatable: one row per bundle)")
    srv.add_argument("--out", type=Path, required=True, help="folder for serve.{json,md}")
    srv.add_argument("--rates", default="50,100,150,200,300,400,600,800,1200,1600,2400,3200,4800",
                     help="offered rates (requests/s), stepped up until one fails the target")
    srv.add_argument("--check-rate", type=at_least(0, float, strict=True), default=100.0,
                     help="the rate whose p99 is reported")
    _add_load_window(srv, duration_help="seconds measured per rate", warmup_help="seconds per rate before measuring")
    srv.add_argument("--arrivals", choices=["poisson", "uniform"], default="poisson")
    srv.add_argument("--timeout", type=at_least(0, float, strict=True), default=2.0,
                     help="request timeout (counts as an error)")
    _add_bodies(srv, min_len=50, max_len=200, what="history")
    srv.add_argument("--k", type=at_least(1), default=10)
    srv.add_argument("--candidates", type=at_least(1), default=200)
    srv.add_argument("--no-rerank", action="store_true", help="retrieval only")
    srv.add_argument("--personalize", action="store_true", help="every request asks for PCRec-simple")
    srv.add_argument("--threads", type=at_least(1), default=1, help="server torch threads")
    srv.add_argument("--max-batch", type=at_least(1), default=32, help="server micro-batch size")
    srv.add_argument("--max-wait-ms", type=at_least(0, float), default=0.0,
                     help="server micro-batch extra wait (0 = adaptive)")
    srv.add_argument("--workers", type=at_least(1), default=1, help="uvicorn workers of both apps (SEQREC_WORKERS)")
    srv.add_argument("--concurrency", type=at_least(1), default=None,
                     help="batches the server runs at once (SEQREC_CONCURRENCY; default: the service's)")
    srv.add_argument("--cpu-rate", type=at_least(0, float, strict=True), default=10.0,
                     help="rate of the run whose server CPU time per request is reported (one both apps keep up with)")
    srv.add_argument("--server-code", type=Path, default=None,
                     help="run both servers from this source tree (another version of seqrec, to compare with)")
    srv.add_argument("--check-answers", type=at_least(0), default=200,
                     help="bodies sent alone after the load and checked against the in-process reference path")
    _add_seed(srv)
    srv.set_defaults(handler=_run_serve)


def _add_index(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    idx = tools.add_parser(
        "index", parents=[common], help="build time, size, latency and recall of FAISS indexes per catalogue size",
        description="For each --sizes catalogue, build the exact index and each approximate structure, sweep "
        "its search parameter, and write OUT/index.{json,md}: build seconds, serialised size, recall@k against "
        "exact search, batch-1 p50/p99 and batch-64 latency, and the cheapest setting reaching --target-recall.",
    )
    idx.add_argument("--out", type=Path, required=True, help="folder for index.{json,md}")
    idx.add_argument("--sizes", default="100000,1000000", help="comma-separated catalogue sizes")
    idx.add_argument("--structures", default="hnsw,ivf,ivfpq",
                     help="of hnsw, ivf, ivfpq (flat, the exact reference, always runs)")
    idx.add_argument("--distribution", choices=["clustered", "gaussian"], default="clustered",
                     help="synthetic catalogue shape (ignored with --artifact or --vectors)")
    idx.add_argument("--spread", type=float, default=1.0,
                     help="clustered: noise scale around each centre (0 = points on the centres)")
    idx.add_argument("--dim", type=at_least(1), default=64, help="synthetic vector dimension")
    idx.add_argument("--artifact", type=Path, default=None, help="use this bundle's item vectors (first --sizes rows)")
    idx.add_argument("--vectors", type=Path, default=None, help="use an (n, d) .npy matrix")
    idx.add_argument("--queries", type=int, default=2000, help="held-out queries for recall")
    idx.add_argument("--latency-queries", type=int, default=500, help="single-query searches timed for batch-1")
    idx.add_argument("--k", type=int, default=100, help="neighbours per query (recall@k)")
    idx.add_argument("--target-recall", type=float, default=0.98)
    idx.add_argument("--threads", type=int, default=1, help="search threads (the service searches on one)")
    idx.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    idx.add_argument("--max-latency-ms", type=float, default=20.0, help="stop a sweep past this batch-1 p50")
    _add_seed(idx)
    idx.set_defaults(handler=_run_index)


def _add_scale(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    scl = tools.add_parser(
        "scale", parents=[common], help="training time, serving p99 and memory against data and catalogue size",
        description="Three scaling curves with fitted log-log slopes: seconds of one training epoch against "
        "interactions (synthetic data, fixed catalogue); p50/p99 of an open-loop load on a served random-init "
        "bundle against catalogue size; training peak RSS (fixed steps and batch) and server RSS against "
        "catalogue size, beside the item tables' bytes. Each training point runs in its own process. Writes "
        "OUT/scale.{json,md} and OUT/{train_time,serve_p99,memory}.png.",
    )
    scl.add_argument("--out", type=Path, required=True, help="folder for scale.{json,md} and the PNGs")
    scl.add_argument("--config", type=Path, default=default_configs_dir() / "synthetic" / "transformer.yaml",
                     help="run config to train and serve")
    scl.add_argument("--curves", default="train,serve,memory", help="comma-separated subset of train,serve,memory")
    scl.add_argument("--interactions", default="100000,1000000,10000000", help="training curve sizes (1e5 works)")
    scl.add_argument("--train-items", type=int, default=100_000, help="fixed catalogue of the training curve")
    scl.add_argument("--mean-length", type=float, default=20.0, help="mean synthetic sequence length")
    scl.add_argument("--valid-users", type=int, default=256, help="fixed users validated after each epoch")
    scl.add_argument("--catalogues", default="10000,100000,1000000", help="catalogue sizes (serving and memory)")
    scl.add_argument("--rate", type=float, default=50.0, help="offered requests/s (open loop, Poisson)")
    _add_load_window(scl, duration_help="seconds measured per catalogue",
                     warmup_help="seconds of load before measuring")
    _add_bodies(scl, min_len=20, max_len=50, what="request history")
    scl.add_argument("--index", choices=["auto", "flat", "hnsw", "ivf"], default="auto",
                     help="the serving bundles' index (auto: exact up to 200,000 items, else HNSW)")
    scl.add_argument("--memory-steps", type=int, default=20, help="training steps per memory point (about)")
    scl.add_argument("--threads", type=int, default=1, help="torch threads for training, serving and index builds")
    scl.add_argument("--point-timeout", type=float, default=3600.0,
                     help="seconds a training process or a server start may take before its point fails")
    _add_seed(scl)
    _add_set(scl)
    scl.add_argument("--keep-work", action="store_true", help="keep OUT/work (data, runs, bundles)")
    scl.add_argument("--note", default="", help="a line for the notes (e.g. where the figures were taken)")
    scl.set_defaults(handler=_run_scale)


def _add_parity(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    par = tools.add_parser(
        "parity", parents=[common], help="served top-k against the offline two-stage top-k, every test user",
        description="Start a real server on the bundle, send every test user's test input (training items and "
        "validation target) as the default request (history and k only), and compare the served top k with "
        "the offline two-stage top k `seqrec evaluate` ranks with. Prints one line: served NDCG@k (from the "
        "served lists), offline NDCG@k and how many users' lists differ; exits 1 if any list differs or the "
        "two NDCG differ by more than 0.001.",
    )
    par.add_argument("--artifact", type=Path, required=True, help="the bundle to serve and evaluate")
    par.add_argument("--data", type=Path, required=True, help="prepared folder the bundle was trained on")
    par.add_argument("--k", type=at_least(1), default=10, help="items per list (NDCG cut-off)")
    par.add_argument("--ready-timeout", type=at_least(0, float, strict=True), default=120.0,
                     help="seconds the server may take to start")
    par.set_defaults(handler=_run_parity)


def _add_two_stage(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    two = tools.add_parser(
        "two-stage", parents=[common], help="the ranker tables: retriever alone, + MLP, + LightGBM, IDs masked",
        description="For each trained retriever (one per seed), train the MLP and the LightGBM ranker on shared "
        "holdout-mined groups (the `seqrec train-ranker` defaults) and write OUT/results.{json,md}: retriever "
        "alone, + MLP, + LightGBM and the MLP with every item ID masked (test HR@10 and NDCG@10, valid NDCG@10) "
        "and the retriever's recall at the depth, mean ± std over the seeds finished under OUT/runs, with the "
        "repeat policy and candidate depth. A rerun reuses finished work (--work).",
    )
    two.add_argument("--artifact", type=Path, action="append", default=[],
                     help="a trained retriever or bundle (repeatable: one per seed; its ranker is ignored)")
    two.add_argument("--data", type=Path, required=True, help="prepared folder the retrievers were trained on")
    two.add_argument("--out", type=Path, required=True, help="folder for results.{json,md}")
    two.add_argument("--work", type=Path, default=None,
                     help="folder for the bundles, mined groups and per-seed records (default OUT/runs)")
    two.add_argument("--depth", type=int, default=100, help="candidates mined, re-ranked and evaluated (N)")
    two.add_argument("--holdout-per-user", type=int, default=ranker_default("holdout_per_user"),
                     help="training items per user the holdout retriever never sees (the rankers' targets)")
    two.add_argument("--features", type=parse_names, default=(),
                     help="comma-separated extra ranker features for both rankers (ranker/groups/; "
                     "use another --work than the base run's)")
    two.add_argument("--mlp-id-dropout", type=float, default=mlp_default("id_dropout"),
                     help="the MLP ranker's ID dropout (default: seqrec train-ranker's)")
    two.add_argument("--mlp-members", type=int, default=1,
                     help="the MLP ranker as an ensemble of this many networks (mean logit; default 1)")
    two.add_argument("--holdout-only", action="store_true",
                     help="only train the holdout retrievers of --config for --seeds (reused by a later run)")
    two.add_argument("--config", type=Path, default=None, help="with --holdout-only: the retrievers' YAML config")
    two.add_argument("--seeds", default=None, help="with --holdout-only: comma-separated seeds")
    two.add_argument("--threads", type=int, default=None, help="CPU threads (and train.threads)")
    two.set_defaults(handler=_run_two_stage)


def _add_seen_set(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    seen = tools.add_parser(
        "seen-set", parents=[common], help="an append's Redis time against the user's seen-set size",
        description="Start a redis-server on a free port; for each size, give one user that many distinct items "
        "(all at one timestamp), then time single-event appends inside Redis (SLOWLOG) while another process "
        "PINGs. Prints a JSON report; exits 1 unless the append's median stays within 3x from the smallest size "
        "to the largest and the PING p99 within 3x + 1 ms.",
    )
    seen.add_argument("--sizes", default="10,100,1000,10000", help="seen-set sizes, comma-separated")
    seen.add_argument("--appends", type=at_least(1), default=200, help="single-event appends timed per size")
    seen.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    seen.set_defaults(handler=_run_seen_set)


def _add_journal(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    journal = tools.add_parser(
        "journal", parents=[common], help="a catalogue change's time against the journal's size, and kill -9",
        description="Serve --artifact (a copy of it) with a real server; time POST /admin/items (one pending "
        "item) and DELETE /admin/items/{id} at each journal size, then kill -9 the server in the middle of a "
        "stream of changes and check that the restarted server serves exactly the acknowledged ones. Prints a "
        "JSON report; exits 1 unless a change's median stays within 3x from the smallest size to the largest and "
        "no acknowledged change is lost.",
    )
    journal.add_argument("--artifact", type=Path, required=True, help="a bundle (copied; never modified)")
    journal.add_argument("--sizes", default="10,100000", help="pending items in the journal, comma-separated")
    journal.add_argument("--changes", type=at_least(1), default=30, help="changes of each kind timed per size")
    journal.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    journal.set_defaults(handler=_run_journal)


def _add_redis_wait(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    wait = tools.add_parser(
        "redis-wait", parents=[common], help="an append's latency with and without WAIT for one replica",
        description="Start a Redis master and one replica; time single-event appends through the history store "
        "with SEQREC_REDIS_WAIT_REPLICAS=0 and =1, in alternating blocks. Prints a JSON report; exits 1 when an "
        "append that waited was not confirmed in time.",
    )
    wait.add_argument("--appends", type=at_least(1), default=2000, help="appends per block")
    wait.add_argument("--rounds", type=at_least(1), default=5, help="blocks of each mode, alternating")
    wait.add_argument("--wait-ms", type=at_least(1), default=100, help="WAIT's timeout (SEQREC_REDIS_WAIT_MS)")
    wait.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    wait.set_defaults(handler=_run_redis_wait)


def _add_cluster_failover(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    from offline.bench.faults.cluster_failover import add_cluster_failover_options

    failover = tools.add_parser(
        "cluster-failover", parents=[common], help="a Redis Cluster master killed under load: answers, lost events",
        description="Start a Redis Cluster (3 masters, 3 replicas) and the service on it; kill a master under a "
        "load of events and user_id reads, wait for its replica to take over, go on; count the HTTP statuses by "
        "phase and the acknowledged events missing afterwards. Prints a JSON report; exits 1 on an answer other "
        "than 2xx or 503, a failure after the failover, or a traceback in the server's log.",
    )
    add_cluster_failover_options(failover)
    failover.set_defaults(handler=_run_cluster_failover)


def _add_hardening(tools: SubParsers, common: argparse.ArgumentParser) -> None:
    from offline.bench.faults.hardening import add_hardening_options

    hardening = tools.add_parser(
        "hardening", parents=[common], help="secure by default, read deadline, connection cap, honest readiness",
        description="Against `seqrec serve` over real sockets: a key-less start on 0.0.0.0 and short keys refused, "
        "foreign Host headers refused, clients trickling a byte every 1.5 s cut at the read deadline while a steady "
        "client is timed beside them, the connection cap, /readyz 503 with the bench's own redis-server killed, no "
        "Redis address or bundle folder in any answer, and every worker's JSON log lines. Prints a JSON report; "
        "exits 1 when a check fails.",
    )
    add_hardening_options(hardening)
    hardening.set_defaults(handler=_run_hardening)


# --------------------------------------------------------------------------- handlers (imports load here)


def _deferred(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """A handler that imports ``module`` (torch, faiss, matplotlib or the load client) only when it runs."""

    def run(args: argparse.Namespace) -> int:
        handler: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
        return handler(args)

    return run


_run_bench = _deferred("offline.bench.quality.models", "run_bench")
_run_merge = _deferred("offline.bench.quality.models", "run_merge")
_run_latency = _deferred("offline.bench.compute.latency", "run_latency")
_run_serve = _deferred("offline.bench.serve.serve", "run_serve_bench")
_run_index = _deferred("offline.bench.compute.index", "run_index_bench")
_run_scale = _deferred("offline.bench.serve.scale", "run_scale")
_run_parity = _deferred("offline.bench.quality.parity", "run_parity")
_run_two_stage = _deferred("offline.bench.quality.two_stage", "run_two_stage")
_run_seen_set = _deferred("offline.bench.faults.seen_set", "run_seen_set")
_run_journal = _deferred("offline.bench.faults.journal", "run_journal")
_run_redis_wait = _deferred("offline.bench.faults.redis_wait", "run_redis_wait")
_run_cluster_failover = _deferred("offline.bench.faults.cluster_failover", "run_cluster_failover")
_run_hardening = _deferred("offline.bench.faults.hardening", "run_hardening")
