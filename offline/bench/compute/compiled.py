"""Eager against compiled (ONNX Runtime) user encoding, side by side in one run.

    python -m offline.bench.compute.compiled --case ml-100k configs/ml-100k/transformer.yaml data/ml-100k \\
        --case beauty configs/beauty/transformer.yaml data/beauty --out docs/results/compiled --threads 1

Each case builds its config's model for the prepared dataset's catalogue (its item features included) with
seeded, untrained weights (the time of a forward pass does not depend on training), compiles the served
encoder as `seqrec train` does (`retriever.compiled.write_encoder`, its parity check included) and times
`Bundle.encode`'s two paths on the same batches: eager (``Retriever.user_vectors`` in inference mode) and
ONNX Runtime, then the MLP ranker's scorer the same way (``--candidates`` per request; with
``--mlp-members 1,3`` a single network and an ensemble of three, `MLPConfig.members`). Batches are real
test-split histories (the last ``length`` items, left-padded to ``length``), at every batch size and length
asked for up to the model's max_len; the two paths alternate call by call (which one goes first alternates
too), so a change in the machine's load reaches both alike. Writes
OUT/compiled.json (every figure and the run's conditions) and OUT/compiled.md; the speed-up is the ratio of
the median times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm import tqdm

from offline.cli.common import SEED
from offline.data.features import item_feature_matrix
from offline.data.prepared import PreparedDataset, load_prepared
from offline.tables import markdown_table
from ranker.compiled import load_mlp, smoke_batches, write_mlp
from ranker.config import MLPConfig
from ranker.mlp import MLPRanker
from retriever.compiled import load_encoder, write_encoder
from retriever.config import RunConfig, config_from_dict
from retriever.model import Retriever

MLP_META = 1000  # metadata values of the timed MLP ranker (the embedding table's size barely matters)


def build_model(config_path: Path, data: PreparedDataset, seed: int) -> tuple[Retriever, RunConfig]:
    """The config's model for ``data``'s catalogue, as training builds it, with seeded untrained weights."""
    raw = yaml.safe_load(config_path.read_text())
    column = raw["model"].get("item_features")
    features = None
    if column:
        features, n_features = item_feature_matrix(data, column)
        raw["model"].update(n_features=n_features, features_per_item=features.shape[1])
    config = config_from_dict(raw, source=str(config_path))
    torch.manual_seed(seed)
    model = config.build(data.n_items).eval()
    if features is not None:
        model.encoder.set_item_features(torch.from_numpy(features))
    return model, config


def histories(data: PreparedDataset, batch: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """(batch, length) test-split histories of random users: their last ``length`` items, left-padded."""
    inputs = data.split().inputs("test")
    out = torch.zeros(batch, length, dtype=torch.long)
    for row, user in enumerate(rng.choice(len(inputs), size=batch)):
        items = inputs.row(int(user))[-length:]
        out[row, length - len(items):] = torch.from_numpy(np.asarray(items, dtype=np.int64))
    return out


Timings = dict[str, dict[str, list[float]]]  # path -> {"wall": ms, "cpu": ms}


def alternate(paths: dict[str, Callable[[], object]], reps: int, warmup: int) -> Timings:
    """Call the paths in turn (the first one alternating), ``warmup`` untimed rounds, then ``reps`` timed ones.

    Each call's wall time and the calling thread's CPU time: with one thread both torch and ONNX Runtime
    compute on the calling thread, so the CPU time leaves out the time other processes held the cores."""
    times: Timings = {name: {"wall": [], "cpu": []} for name in paths}
    names = list(paths)
    for rep in range(warmup + reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            wall, cpu = time.perf_counter(), time.thread_time()
            paths[name]()
            if rep >= warmup:
                times[name]["cpu"].append(1000 * (time.thread_time() - cpu))
                times[name]["wall"].append(1000 * (time.perf_counter() - wall))
    return times


def summary(times: Timings) -> dict[str, Any]:
    """Median wall and CPU milliseconds of both paths, p90 wall, and the speed-ups (eager / ONNX medians)."""
    row: dict[str, Any] = {}
    for name, kinds in times.items():
        row[f"{name}_ms"] = round(float(np.median(kinds["wall"])), 4)
        row[f"{name}_p90_ms"] = round(float(np.percentile(kinds["wall"], 90)), 4)
        row[f"{name}_cpu_ms"] = round(float(np.median(kinds["cpu"])), 4)
    row["speedup"] = round(row["eager_ms"] / row["onnx_ms"], 2)
    row["cpu_speedup"] = round(row["eager_cpu_ms"] / row["onnx_cpu_ms"], 2)
    return row


def time_pair(model: Retriever, compiled: Any, ids: torch.Tensor, reps: int, warmup: int) -> dict[str, Any]:
    """Both paths of `Bundle.encode` on ``ids``, and their largest difference."""
    def eager() -> torch.Tensor:
        with torch.inference_mode():
            return model.user_vectors(ids).float()

    row = summary(alternate({"eager": eager, "onnx": lambda: compiled(ids)}, reps, warmup))
    row["max_abs_diff"] = float((eager() - compiled(ids)).abs().max())
    return row


def time_mlp(n_items: int, dim: int, batch: int, candidates: int, args: argparse.Namespace,
             members: int = 1) -> dict[str, Any]:
    """The MLP ranker's scorer (default sizes, seeded untrained weights) eager against ONNX Runtime."""
    torch.manual_seed(args.seed)
    mlp = MLPRanker(MLPConfig(n_items=n_items, n_meta=MLP_META, n_year_buckets=20, dim=dim, members=members)).eval()
    with tempfile.TemporaryDirectory() as work:
        reason = write_mlp(Path(work), mlp)
        if reason is not None:
            raise SystemExit(f"the MLP ranker does not compile: {reason}")
        compiled = load_mlp(Path(work), mlp, threads=args.threads)
    (features,) = smoke_batches(mlp, ((batch, candidates, 3),), seed=args.seed)
    row = {"members": members, "batch": batch, "candidates": candidates,
           **summary(alternate({"eager": lambda: mlp.score(features), "onnx": lambda: compiled.score(features)},
                               args.reps, args.warmup))}
    expected, got = mlp.score(features), compiled.score(features)
    finite = torch.isfinite(expected)
    row["max_abs_diff"] = float((got - expected)[finite].abs().max())
    return row


def run_case(name: str, config_path: Path, data_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    data = load_prepared(data_path)
    model, config = build_model(config_path, data, args.seed)
    max_len = config.max_len(data.n_items)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        reason = write_encoder(Path(work), model, max_len)
        export_s = time.perf_counter() - start
        if reason is not None:
            raise SystemExit(f"{name}: the encoder does not compile: {reason}")
        size = (Path(work) / "encoder.onnx").stat().st_size
        compiled = load_encoder(Path(work), model, max_len, threads=args.threads)
    rng = np.random.default_rng(args.seed)
    rows = []
    grid = [(length, batch) for length in args.lengths for batch in args.batches if length <= max_len]
    for length, batch in tqdm(grid, desc=name, leave=False):
        ids = histories(data, batch, length, rng)
        rows.append({"length": length, "batch": batch, "real_items_mean": round(float((ids > 0).sum(1).float()
                     .mean()), 1), **time_pair(model, compiled, ids, args.reps, args.warmup)})
    mlp_rows = [time_mlp(data.n_items, int(model.item_vectors().shape[1]), batch, args.candidates, args, members)
                for members in args.mlp_members for batch in args.mlp_batches]
    skipped = [length for length in args.lengths if length > max_len]
    return {"case": name, "config": str(config_path), "data": str(data_path), "n_items": data.n_items,
            "max_len": max_len, "backbone": config.model.backbone,
            "parameters": sum(p.numel() for p in model.parameters()), "export_seconds": round(export_s, 2),
            "onnx_bytes": size, "lengths_over_max_len": skipped, "rows": rows, "mlp_rows": mlp_rows}


def write_report(out: Path, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compiled.json").write_text(json.dumps(record, indent=2) + "\n")
    head = ["case", "history length", "batch", "eager CPU ms", "ONNX CPU ms", "speed-up (CPU)", "eager wall ms",
            "ONNX wall ms", "speed-up (wall)", "max |diff|"]
    rows = [[case["case"], r["length"], r["batch"], *_cells(r)] for case in record["cases"] for r in case["rows"]]
    notes = [f"- {c['case']}: {c['backbone']} from `{c['config']}`, {c['n_items']:,} items, max_len "
             f"{c['max_len']}, {c['parameters']:,} parameters; exported in {c['export_seconds']} s "
             f"({c['onnx_bytes']:,} bytes)"
             + (f"; lengths {c['lengths_over_max_len']} exceed its max_len (not run)"
                if c["lengths_over_max_len"] else "")
             for c in record["cases"]]
    text = "\n".join([
        "# Compiled encoder: eager against ONNX Runtime", "",
        f"Written by `{record['command']}` on {record['date']}.", "",
        "Per-batch time of `Bundle.encode` (histories -> user vectors), both paths on the same batches, "
        f"alternating call by call; {record['reps']} timed calls each after {record['warmup']} warm-up calls, "
        f"{record['threads']} thread(s) for torch and ONNX Runtime. Untrained weights (the time does not depend "
        "on them). Medians; speed-up = eager median / ONNX median. CPU ms is the calling thread's CPU time "
        "(with one thread both runtimes compute on it), which leaves out the time other processes held the "
        "cores; wall ms includes it.", "",
        markdown_table(head, rows), "", *notes, "",
        "The MLP ranker's scorer (its default sizes for the case's catalogue and vector size, untrained, "
        f"{MLP_META} metadata values, 3 per candidate), eager (`MLPRanker.score`) against ONNX Runtime "
        "(`ranker.compiled`), timed the same way:", "",
        markdown_table(["case", "networks (`members`)", "batch", "candidates", *head[3:]],
                       [[c["case"], r.get("members", 1), r["batch"], r["candidates"], *_cells(r)]
                        for c in record["cases"] for r in c["mlp_rows"]]), "",
        f"Conditions: {record['machine']}; load average {record['load_before']} before, {record['load_after']} "
        f"after. {record['remark']}", "",
    ])
    (out / "compiled.md").write_text(text)


def _cells(row: dict[str, Any]) -> list[Any]:
    return [f"{row['eager_cpu_ms']:.2f}", f"{row['onnx_cpu_ms']:.2f}", f"{row['cpu_speedup']}x",
            f"{row['eager_ms']:.2f}", f"{row['onnx_ms']:.2f}", f"{row['speedup']}x", f"{row['max_abs_diff']:.1e}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", nargs=3, action="append", required=True, metavar=("NAME", "CONFIG", "DATA"),
                        help="a model config and its prepared dataset (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder for compiled.{json,md}")
    parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--lengths", default="50,200", help="comma-separated history lengths")
    parser.add_argument("--mlp-batches", default="1,8", help="comma-separated batch sizes of the MLP ranker")
    parser.add_argument("--mlp-members", default="1",
                        help="comma-separated ensemble sizes of the MLP ranker (`MLPConfig.members`)")
    parser.add_argument("--candidates", type=int, default=200, help="candidates per request the MLP scores")
    parser.add_argument("--reps", type=int, default=40, help="timed calls per path and cell")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per path and cell")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--remark", default="", help="what else ran on the machine meanwhile")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.lengths = [int(n) for n in args.lengths.split(",")]
    args.mlp_batches = [int(b) for b in args.mlp_batches.split(",")]
    args.mlp_members = [int(k) for k in args.mlp_members.split(",")]
    if min(args.mlp_members) < 1:
        parser.error(f"--mlp-members must be at least 1, got {min(args.mlp_members)}")
    torch.set_num_threads(args.threads)
    load_before = [round(x, 2) for x in os.getloadavg()]
    cases = [run_case(name, Path(config), Path(data), args) for name, config, data in args.case]
    record = {
        "command": "python -m offline.bench.compute.compiled " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "threads": args.threads, "reps": args.reps,
        "warmup": args.warmup, "torch": torch.__version__, "onnxruntime": _ort_version(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
        "remark": args.remark, "cases": cases,
    }
    write_report(args.out, record)
    print((args.out / "compiled.md").read_text())
    return 0


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
