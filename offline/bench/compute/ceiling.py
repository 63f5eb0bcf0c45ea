"""What the model's arithmetic alone allows on this machine, set against the no-op app's rate (issue 27).

    python -m offline.bench.compute.ceiling --artifact BUNDLE [--artifact ...] --out docs/results/serve/ceiling
        [--serve docs/results/serve/ceiling/serve.json]

For the `seqrec bench serve` request bodies (``--min-len``..``--max-len`` random catalogue items, cut to the
model's window, k=10, ``--candidates``), in this process on one thread:

- the encoder's FLOP per request, counted on the eager encoder as `seqrec bench` counts a model's
  (`offline.bench.lib.measure.forward_flops`: matrix products and attention; norms, activations and lookups are
  not counted, so a lower bound of its arithmetic);
- the CPU time per request of the served encoder (compiled where the bundle's is) and of the whole model path
  (`service.system.recommend.recommend_batch`: encoder, FAISS, features, ranker), at batch 1 and batch 32, and the
  FLOP rate the encoder reaches;
- this core's float32 matrix-multiply rate on a transformer feed-forward's shape (8,192 positions x d_model
  into 4 x d_model), the best case for that arithmetic.

With ``--serve`` (a `seqrec bench serve` JSON that measured the same bundles), it also states the cores the
model path alone needs at half the no-op app's highest rate (the issue's target): at the measured batch-32 cost,
and for the encoder alone at the core's peak rate. More than the machine's cores means the target cannot be met
with this model on this machine, whatever the serving code does.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import SeqrecError
from offline.bench.lib.measure import forward_flops, median_cpu_ms
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.tables import markdown_table
from retriever.compiled import ServedEncoder
from retriever.model import Retriever
from service.http.engine import set_threads
from service.system.loader import load_bundle
from service.system.query import plan_query
from service.system.recommend import _padded_histories, recommend_batch

BATCHES = (1, 32)
GEMM_ROWS = 8192  # positions of the feed-forward product timed for the core's peak rate


def encoder_flop(model: Retriever, lengths: list[int], n_items: int) -> dict[int, float]:
    """FLOP of one history of each length through the eager served encoder (`offline.bench.lib.measure.forward_flops`:
    matrix products and attention; norms, activations and lookups are not counted)."""
    encoder = ServedEncoder(model).eval()
    return {length: forward_flops(encoder, length, n_items) for length in sorted(set(lengths))}


def gemm_gflops(d_model: int, rounds: int = 200) -> float:
    """This core's float32 product rate on a (GEMM_ROWS, d) x (d, 4d) matrix, in GFLOP/s: the fastest of
    ``rounds`` calls (a peak, so the best time, not the median)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_ROWS, d_model, generator=generator)
    w = torch.randn(d_model, 4 * d_model, generator=generator)
    best = float("inf")
    for _ in range(rounds):
        started = time.thread_time()
        a @ w
        best = min(best, time.thread_time() - started)
    return 2 * GEMM_ROWS * d_model * 4 * d_model / max(best, 1e-9) / 1e9


def measure(artifact: Path, *, requests: int = 256, min_len: int = 50, max_len: int = 200, candidates: int = 200,
            rounds: int = 3, seed: int = 0) -> dict[str, Any]:
    set_threads(1)
    bundle = load_bundle(artifact)
    payloads = payloads_from_catalogue(load_catalogue(artifact), requests, min_len, max_len, seed,
                                       candidates=candidates)
    queries = []
    for p in payloads:
        query = plan_query(bundle, [bundle.index_of[i] for i in p["history"]], set(), k=p["k"],
                           candidates=p["candidates"], exclude_seen=True)
        if query is None:
            raise SeqrecError(f"{artifact}: a request body mapped to an empty history")
        queries.append(query)
    lengths = [len(q.history) for q in queries]
    flop = encoder_flop(bundle.artifact.model, lengths, bundle.n_items)
    per_request_flop = float(np.mean([flop[n] for n in lengths]))
    recommend_batch(bundle, queries[:8])  # warm-up
    rows = []
    for size in BATCHES:
        chunks = [queries[s:s + size] for s in range(0, len(queries), size)]
        histories = [_padded_histories(chunk, bundle.max_len) for chunk in chunks]
        with torch.inference_mode():
            encode = sum(median_cpu_ms(functools.partial(bundle.encode, h), rounds) for h in histories)
            model = sum(median_cpu_ms(functools.partial(recommend_batch, bundle, c), rounds) for c in chunks)
        encode, model = encode / len(queries), model / len(queries)
        rows.append({"batch": size, "encoder_ms": round(encode, 4), "model_ms": round(model, 4),
                     "encoder_gflops": round(per_request_flop / (encode / 1000) / 1e9, 1)})
    d_model = int(bundle.vectors.shape[1])
    return {"bundle": str(artifact), "name": artifact.name, "version": bundle.version, "max_len": bundle.max_len,
            "encoder": type(bundle.compiled_encoder).__name__ if bundle.compiled_encoder is not None else "eager",
            "requests": requests, "history": [min_len, max_len], "candidates": candidates, "rounds": rounds,
            "mean_history": round(float(np.mean(lengths)), 1), "encoder_mflop": round(per_request_flop / 1e6, 2),
            "d_model": d_model, "gemm_gflops": round(gemm_gflops(d_model), 1), "rows": rows}


def against_serve(report: dict[str, Any], serve: dict[str, Any], cores: int) -> dict[str, Any] | None:
    """Cores the model path needs at half the no-op app's highest rate, from a `seqrec bench serve` JSON."""
    target = next((t for t in serve["targets"].values() if Path(t["bundle"]).name == report["name"]), None)
    if target is None or not target["noop"]["max_rate_p99_50ms"]:
        return None
    rate = target["noop"]["max_rate_p99_50ms"] / 2
    batch = max(report["rows"], key=lambda r: r["batch"])
    return {"noop_max_rate": target["noop"]["max_rate_p99_50ms"], "half_rate": rate,
            "seqrec_max_rate": target["service"]["max_rate_p99_50ms"], "cores": cores,
            "model_cores": round(rate * batch["model_ms"] / 1000, 2),
            "encoder_cores": round(rate * batch["encoder_ms"] / 1000, 2),
            "encoder_cores_at_peak": round(rate * report["encoder_mflop"] * 1e6 / (report["gemm_gflops"] * 1e9), 2)}


def to_markdown(reports: list[dict[str, Any]], serve: str | None = None) -> str:
    head = ["bundle", "window", "mean history", "encoder", "encoder MFLOP/request", "batch",
            "encoder CPU ms/request", "encoder GFLOP/s", "model path CPU ms/request", "core's peak GFLOP/s"]
    body = [[r["name"], r["max_len"], r["mean_history"], r["encoder"], r["encoder_mflop"], row["batch"],
             row["encoder_ms"], row["encoder_gflops"], row["model_ms"], r["gemm_gflops"]]
            for r in reports for row in r["rows"]]
    first = reports[0]
    lo, hi = first["history"]
    lines = ["# What the model's arithmetic allows", "",
             f"{first['requests']} request bodies of {lo}-{hi} random catalogue items (cut to each model's window), "
             f"k=10, {first['candidates']} candidates; in one process on one thread, medians of {first['rounds']} "
             "rounds. Model path = `service.system.recommend.recommend_batch` (encoder, FAISS, features, ranker), "
             "no HTTP. "
             "The encoder's FLOP count is its matrix products and attention "
             "(`offline.bench.lib.measure.forward_flops` on "
             "the eager encoder), a lower bound; the core's peak is the fastest of 200 float32 products of a "
             "transformer feed-forward's shape.", "",
             markdown_table(head, body)]
    needs = [(r["name"], r["serve"]) for r in reports if r.get("serve")]
    if needs:
        lines += ["", f"At half the no-op app's highest rate (the target of issue 27), from the `seqrec bench serve` "
                  f"run in `{serve}`: the cores the model path alone needs at its batch-32 cost, and the encoder alone "
                  "at the measured speed and at the core's peak.", "",
                  markdown_table(["bundle", "no-op highest rate", "half of it", "seqrec highest rate",
                                  "model path cores", "encoder cores", "encoder cores at peak", "machine cores"],
                                 [[name, s["noop_max_rate"], s["half_rate"], s["seqrec_max_rate"], s["model_cores"],
                                   s["encoder_cores"], s["encoder_cores_at_peak"], s["cores"]] for name, s in needs])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, action="append", required=True, help="bundle (repeatable)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--serve", type=Path, default=None, help="a `seqrec bench serve` JSON of the same bundles")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=50)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    serve = None
    if args.serve is not None:
        try:
            serve = json.loads(args.serve.read_text())
        except (OSError, ValueError) as err:
            raise SeqrecError(f"--serve {args.serve}: cannot read it: {err}") from None
    reports = []
    for artifact in args.artifact:
        report = measure(artifact, requests=args.requests, min_len=args.min_len, max_len=args.max_len,
                         candidates=args.candidates, rounds=args.rounds)
        if serve is not None:
            report["serve"] = against_serve(report, serve, os.cpu_count() or 1)
        reports.append(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ceiling.json").write_text(json.dumps({"serve": None if args.serve is None else str(args.serve),
                                                       "bundles": reports}, indent=2))
    text = to_markdown(reports, None if args.serve is None else os.path.relpath(args.serve, args.out))
    (args.out / "ceiling.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
