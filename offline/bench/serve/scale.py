"""`seqrec bench scale`: how training time, serving latency and memory grow with the data and the catalogue.

    seqrec bench scale --out results/scale     # 1e5..1e7 interactions, 1e4..1e6 items

Three curves, each with its log-log slopes (``fit_alpha``: 1 = linear, 0 = flat):

train   seconds of exactly one training epoch (the history record's ``epoch_seconds``: the
        training pass alone, validation excluded) against the number of interactions, on synthetic
        data (``prepare_dataset``) over a fixed catalogue, and that training's peak RSS.
serve   p50/p99 of an open-loop load at a fixed rate against catalogue size: per size, a bundle
        with a randomly initialised model of the config (latency does not depend on what the weights
        learned) and the index ``spec_for_catalogue`` picks, served by a real uvicorn process,
        retrieval only; the server's RSS after the load and the bundle's bytes on disk.
memory  the server's RSS from ``serve``, and the peak RSS of the same few training steps (same
        data, same batch) at each catalogue size beside what the item tables should add:
        (n_items + 1) x d x 4 bytes for each of weights, gradients and the two Adam moments.

Each training point runs in its own process, forked from a forkserver that has imported torch
once. Its peak RSS is that process's VmHWM read when the training pass ends (the validation
callback's first act); not ru_maxrss, which Linux carries across exec from the launching process.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import SeqrecError
from offline.bench.lib.load import run_load
from offline.bench.lib.payloads import payloads_from_catalogue
from offline.bench.lib.processes import SERVICE_APP, rss_bytes, start_server_process
from offline.bench.serve.scale_report import CURVES, MB, TABLE_COPIES, refresh
from offline.cli.common import configure_logging

if TYPE_CHECKING:
    from offline.data.split import LeaveOneOut
    from retriever.config import RunConfig

log = logging.getLogger(__name__)

# what every training process imports (torch._dynamo: the optimiser's, seconds of it), imported once instead
CHILD_PRELOAD = ["torch", "torch._dynamo", "torch.utils.tensorboard", "retriever.train", "offline.evaluation.evaluate",
                 __name__]

# --------------------------------------------------------------------------- options


def parse_sizes(text: str, flag: str) -> list[int]:
    """``"1e5,1000000"`` -> ``[100000, 1000000]``: whole numbers >= 1, distinct, ascending."""
    sizes: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            raise SeqrecError(f"{flag}: {part!r} is not a number") from None
        if not value.is_integer() or value < 1:
            raise SeqrecError(f"{flag}: sizes must be whole numbers >= 1, got {part!r}")
        sizes.add(int(value))
    if not sizes:
        raise SeqrecError(f"{flag} is empty")
    return sorted(sizes)


def check_options(args: argparse.Namespace) -> tuple[list[str], list[int], list[int], RunConfig]:
    """The curves, interaction counts, catalogue sizes and resolved config; a SeqrecError names a bad option."""
    from offline.data.readers.synthetic import SyntheticConfig
    from retriever.config import load_config

    curves = [c.strip() for c in args.curves.split(",") if c.strip()]
    if not curves or set(curves) - set(CURVES):
        raise SeqrecError(f"--curves takes a comma-separated subset of {','.join(CURVES)}, got {args.curves!r}")
    interactions = parse_sizes(args.interactions, "--interactions")
    catalogues = parse_sizes(args.catalogues, "--catalogues")
    positive = {"--rate": args.rate, "--duration": args.duration, "--threads": args.threads,
                "--requests": args.requests, "--memory-steps": args.memory_steps, "--valid-users": args.valid_users,
                "--point-timeout": args.point_timeout}
    bad = [f"{flag} {value:g}" for flag, value in positive.items() if not value > 0]
    if bad:
        raise SeqrecError(f"must be > 0: {', '.join(bad)}")
    if args.warmup < 0:
        raise SeqrecError(f"--warmup must be >= 0, got {args.warmup:g}")
    if not 1 <= args.min_len <= args.max_len:
        raise SeqrecError(f"history lengths --min-len {args.min_len} --max-len {args.max_len}: need 1 <= min <= max")
    if "serve" in curves and catalogues[0] < args.max_len:
        raise SeqrecError(f"--catalogues: {catalogues[0]} items cannot fill a history of --max-len {args.max_len}")
    for flag, n_items in (("--train-items", args.train_items), ("--catalogues", catalogues[0])):
        try:
            SyntheticConfig(n_items=n_items, mean_length=args.mean_length)
        except ValueError as err:
            raise SeqrecError(f"{flag} / --mean-length: synthetic data: {err}") from None
    return curves, interactions, catalogues, load_config(args.config, training_overrides(args))


def training_overrides(args: argparse.Namespace) -> list[str]:
    """--set, then exactly one CPU epoch on --threads threads."""
    return [*(args.set or []), "train.epochs=1", "train.eval_every=1", "train.device=cpu",
            f"train.threads={args.threads}", "train.budget_minutes=null"]


# --------------------------------------------------------------------------- training points


def synthetic_split(folder: Path, n_users: int, n_items: int, mean_length: float, seed: int
                    ) -> tuple[LeaveOneOut, dict[str, Any]]:
    """`seqrec prepare --dataset synthetic` into ``folder``, loaded and split leave-one-out."""
    from offline.data.prepare import prepare_dataset
    from offline.data.prepared import load_prepared
    from offline.data.readers import ReaderOptions

    synthetic = {"n_users": n_users, "n_items": n_items, "mean_length": mean_length, "seed": seed}
    manifest = prepare_dataset("synthetic", folder, ReaderOptions(synthetic=synthetic), overwrite=True)
    return load_prepared(folder).split(), manifest


def write_training_arrays(path: Path, split: LeaveOneOut, valid_users: int, seed: int) -> None:
    """The training positions (CSR) and a fixed sample of validation users, for a training process."""
    from offline.data.sequences import Sequences

    train = split.train
    rows = np.sort(np.random.default_rng(seed).choice(len(train), size=min(valid_users, len(train)), replace=False))
    sample = Sequences.from_lists([train.row(int(r)).tolist() for r in rows])
    np.savez(path, offsets=train.offsets, items=train.items, valid_offsets=sample.offsets, valid_items=sample.items,
             valid_targets=split.valid_targets[rows])


def run_training_process(work: Path, args: argparse.Namespace, arrays: Path, n_items: int) -> dict[str, Any]:
    """One epoch of ``fit`` in a fresh process (forked from the forkserver); its figures."""
    spec = {"config": str(args.config), "overrides": training_overrides(args), "arrays": str(arrays),
            "n_items": n_items, "run_dir": str(work / "run"), "result": str(work / "result.json"),
            "log_level": logging.getLogger().getEffectiveLevel()}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(CHILD_PRELOAD)  # no effect once the forkserver runs
    process = context.Process(target=train_process, args=(spec,), name="seqrec-scale-train", daemon=True)
    process.start()
    try:
        process.join(args.point_timeout)
        timed_out = process.is_alive()
    finally:
        if process.is_alive():  # timed out, or this process was interrupted
            process.kill()
            process.join()
    if timed_out:
        raise SeqrecError(f"the training process did not finish within --point-timeout {args.point_timeout:g} s")
    code = process.exitcode or 0
    if code < 0:
        raise SeqrecError(f"the training process was killed by signal {-code}"
                          + (" (SIGKILL: out of memory?)" if code == -9 else ""))
    if code:
        raise SeqrecError(f"the training process exited with code {code} (its output is above)")
    return dict(json.loads((work / "result.json").read_text()))


def vm_hwm_mb() -> float:
    """This process's own peak RSS (VmHWM: per address space, so not inherited across fork or exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SeqrecError("/proc/self/status has no VmHWM line")


def train_process(spec: dict[str, Any]) -> None:
    """The training process: one epoch of ``fit`` on the spec's arrays; writes its figures as JSON."""
    import torch

    from offline.data.sequences import Sequences
    from offline.evaluation.evaluate import summarize, target_ranks
    from retriever.config import load_config
    from retriever.model import Retriever
    from retriever.train import fit

    configure_logging(spec["log_level"])
    config = load_config(Path(spec["config"]), spec["overrides"])
    n_items = int(spec["n_items"])
    max_len = config.max_len(n_items)
    with np.load(spec["arrays"], allow_pickle=False) as arrays:
        train = Sequences(arrays["offsets"], arrays["items"])
        valid = Sequences(arrays["valid_offsets"], arrays["valid_items"])
        targets = arrays["valid_targets"]
    peak: list[float] = []

    def validate(model: Retriever) -> dict[str, float]:
        peak.append(vm_hwm_mb())  # fit calls this right after the training pass
        return summarize(target_ranks(model.score, valid, targets, n_items, max_len=max_len, desc="valid sample"),
                         (10,))

    rss_before = rss_bytes(os.getpid()) / MB  # imports, arrays and config; no model yet
    record = fit(config, train.offsets, train.items, n_items, validate, Path(spec["run_dir"])).history[0]
    figures = {"epoch_seconds": record["epoch_seconds"], "steps": record["step"], "loss": round(record["loss"], 4),
               "sequences_per_second": record["sequences_per_second"], "peak_rss_mb": round(peak[0], 1),
               "rss_before_fit_mb": round(rss_before, 1), "process_peak_rss_mb": round(vm_hwm_mb(), 1),
               "history_peak_memory_mb": record["peak_memory_mb"], "valid_sample": record.get("valid", {}),
               "torch_threads": torch.get_num_threads()}
    Path(spec["result"]).write_text(json.dumps(figures))


def train_time_point(n_interactions: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n_users = max(1, round(n_interactions / args.mean_length))
    log.info("generating %s users x %g interactions over %s items", f"{n_users:,}", args.mean_length,
             f"{args.train_items:,}")
    split, manifest = synthetic_split(work / "data", n_users, args.train_items, args.mean_length, args.seed)
    write_training_arrays(work / "arrays.npz", split, args.valid_users, args.seed)
    positions = len(split.train.items)
    del split  # this process's copy is not needed while the child trains
    shutil.rmtree(work / "data")
    log.info("training one epoch on %s interactions in a child process", f"{manifest['interactions']:,}")
    figures = run_training_process(work, args, work / "arrays.npz", args.train_items)
    return {"interactions_requested": n_interactions, "interactions": manifest["interactions"],
            "users": manifest["users"], "items_seen": manifest["items"], "train_positions": positions, **figures}


def memory_point(n_items: int, args: argparse.Namespace, work: Path, arrays: Path, config: RunConfig,
                 served: dict[int, float]) -> dict[str, Any]:
    figures = run_training_process(work, args, arrays, n_items)
    dim = config.build(2).encoder.item_embeddings().shape[1]  # floats per trained item row
    positions = config.train.batch_size * config.max_len(n_items)
    return {"n_items": n_items, **figures, "server_rss_mb": served.get(n_items),
            "expected_tables_mb": round(TABLE_COPIES * (n_items + 1) * dim * 4 / MB, 2),
            "full_logits_mb": round(positions * n_items * 4 / MB, 1)}


# --------------------------------------------------------------------------- serving points


def serve_point(n_items: int, args: argparse.Namespace, work: Path, config: RunConfig) -> dict[str, Any]:
    """A random-init bundle of ``n_items`` items served by uvicorn, offered ``--rate`` for ``--duration``."""
    import torch

    from retriever.artifact import write_artifact
    from retriever.index import IndexSpec, spec_for_catalogue

    torch.manual_seed(args.seed)
    item_ids = np.char.add("i", np.arange(1, n_items + 1).astype(str))
    spec = spec_for_catalogue(n_items) if args.index == "auto" else IndexSpec(kind=args.index)
    log.info("writing a bundle of %s items (random init, %s index)", f"{n_items:,}", spec.kind)
    started = time.perf_counter()
    write_artifact(work / "bundle", config.build(n_items), config, item_ids, index_spec=spec,
                   extra={"weights": "random initialisation (seqrec bench scale)"})
    build_seconds = time.perf_counter() - started
    bundle_bytes = sum(f.stat().st_size for f in (work / "bundle").rglob("*") if f.is_file())
    payloads = payloads_from_catalogue(item_ids, args.requests, args.min_len, args.max_len, args.seed, rerank=False)
    env = {"SEQREC_ARTIFACTS": str(work / "bundle"), "SEQREC_THREADS": str(args.threads),
           "SEQREC_LOG_LEVEL": "warning"}
    with start_server_process(SERVICE_APP, env, ready_timeout_s=args.point_timeout) as server:
        rss_ready = rss_bytes(server.pid) / MB
        log.info("offering %g r/s for %g s (+ %g s warm-up)", args.rate, args.duration, args.warmup)
        load = run_load(server.url, payloads, args.rate, args.duration, args.warmup, args.seed)
        rss_after = rss_bytes(server.pid) / MB
    log.info("%s items: p50 %.2f ms, p99 %.2f ms, %d errors, server RSS %.0f MB", f"{n_items:,}", load.p50_ms,
             load.p99_ms, load.errors, rss_after)
    return {"n_items": n_items, "index": spec.to_dict(), "bundle_seconds": round(build_seconds, 2),
            "bundle_mb": round(bundle_bytes / MB, 2), "p50_ms": load.p50_ms, "p99_ms": load.p99_ms,
            "sent": load.sent, "ok": load.ok, "errors": load.errors, "error_kinds": load.error_kinds,
            "server_rss_ready_mb": round(rss_ready, 1), "server_rss_mb": round(rss_after, 1)}


# --------------------------------------------------------------------------- `seqrec bench scale`


def run_curve(report: dict[str, Any], name: str, sizes: Sequence[int], measure: Callable[[int, Path], dict[str, Any]],
              args: argparse.Namespace, started: float) -> None:
    """``measure(size, folder)`` at each size in turn; a failure (time, memory) ends the curve and is reported."""
    for i, size in enumerate(sizes, 1):
        folder = args.out / "work" / f"{name}-{size}"
        folder.mkdir(parents=True, exist_ok=True)
        log.info("[%s %d/%d] %s", name, i, len(sizes), f"{size:,}")
        try:
            report[name]["points"].append(measure(size, folder))
        except Exception as err:  # one point past this machine's time or memory must not lose the others
            log.error("%s at %s: %s", name, f"{size:,}", err)
            report[name]["error"] = f"at {size:,}: {type(err).__name__}: {err}"
            break
        finally:
            if not args.keep_work:
                shutil.rmtree(folder, ignore_errors=True)
            report["seconds"] = round(time.perf_counter() - started, 1)
            refresh(args.out, report, name)


def run_scale(args: argparse.Namespace) -> int:
    import faiss
    import torch

    curves, interactions, catalogues, config = check_options(args)
    torch.set_num_threads(args.threads)  # the serving bundles' models and indexes are built in this process
    faiss.omp_set_num_threads(args.threads)
    started, work = time.perf_counter(), args.out / "work"
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": scale_command(args), "config": str(args.config), "seconds": 0.0,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "handler"},
        "machine": {"cpus": os.cpu_count(), "load_start": [round(v, 2) for v in os.getloadavg()]},
        "notes": [*filter(None, [args.note]),
                  *(["Serving bundles hold randomly initialised weights: latency does not depend on what they "
                     "learned. Server RSS: the uvicorn process's VmRSS."] if "serve" in curves else []),
                  "Training peak RSS: VmHWM of the training process (one per point, forked from a forkserver that "
                  "imported torch) read as the training pass ends."],
        **{name: {"points": [], "slopes": {}} for name in curves},
    }
    if "train" in curves:
        run_curve(report, "train", interactions, lambda n, folder: train_time_point(n, args, folder), args, started)
    if "serve" in curves:
        run_curve(report, "serve", catalogues, lambda n, folder: serve_point(n, args, folder, config), args, started)
    if "memory" in curves:
        served = {p["n_items"]: p["server_rss_mb"] for p in report.get("serve", {}).get("points", [])}
        n_users = args.memory_steps * config.train.batch_size  # about one window per user
        log.info("generating %s users over %s items for the memory curve", f"{n_users:,}", f"{catalogues[0]:,}")
        split, _ = synthetic_split(work / "memory-data", n_users, catalogues[0], args.mean_length, args.seed)
        write_training_arrays(work / "memory.npz", split, args.valid_users, args.seed)
        run_curve(report, "memory", catalogues, lambda n, folder: memory_point(
            n, args, folder, work / "memory.npz", config, served), args, started)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    for name in curves:
        fitted = ", ".join(f"{k} {v:.2f}" for k, v in report[name]["slopes"].items() if v is not None)
        status = f"stopped {report[name]['error']}" if "error" in report[name] else "done"
        print(f"{name:<7} {len(report[name]['points'])} point(s), slopes: {fitted or '—'} ({status})")
    print(f"scale -> {args.out / 'scale.md'} (.json, .png)")
    return 0


def scale_command(args: argparse.Namespace) -> str:
    options = ["out", "config", "curves", "interactions", "train_items", "mean_length", "valid_users", "catalogues",
               "rate", "duration", "warmup", "requests", "min_len", "max_len", "index", "memory_steps", "threads",
               "point_timeout", "seed"]
    parts = ["seqrec bench scale", *(f"--{o.replace('_', '-')} {shlex.quote(str(getattr(args, o)))}" for o in options)]
    parts += [f"--set {shlex.quote(item)}" for item in args.set or []]
    parts += ["--keep-work"] if args.keep_work else []
    return " ".join(parts + ([f"--note {shlex.quote(args.note)}"] if args.note else []))
