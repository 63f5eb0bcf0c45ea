"""The compiled encoder and the ranker's history cosines on a micro-batch of mixed history lengths: one
padded call against length groups.

    python -m offline.bench.compute.encoder_lengths --artifact BUNDLE --out docs/results/serve/length-groups

For batches of 1 to 32 histories of ``--min-len``..``--max-len`` random catalogue items (cut to the model's
window), the CPU time per history of the bundle's ONNX encoder run as one call padded to the longest history
(what the service did before) and in length groups (`retriever.compiled.OnnxEncoder`), the two alternating on
the same batches (each one first every other round) in this process, one thread; and the largest difference
between the two paths' user vectors. Then the same for the ranker's history cosines
(`ranker.groups.similarity.similarity_features`) over each batch's ``--candidates`` retrieved items: one block over
the padded batch against length groups, and whether the two give bit-identical features.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import SeqrecError
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.tables import markdown_table
from ranker.groups.similarity import COLUMNS, similarity_block, similarity_features
from retriever.compiled import OnnxEncoder
from service.http.engine import set_threads
from service.system.loader import load_bundle
from service.system.recommend import Query, _padded_histories

BATCHES = (1, 2, 4, 8, 16, 32)


def measure(artifact: Path, *, requests: int = 256, min_len: int = 50, max_len: int = 200, rounds: int = 5,
            candidates: int = 200, seed: int = 0) -> dict[str, Any]:
    set_threads(1)
    bundle = load_bundle(artifact, inference="onnx")
    encoder = bundle.compiled_encoder
    if not isinstance(encoder, OnnxEncoder):
        raise SeqrecError(f"{artifact}: its encoder does not serve compiled")
    payloads = payloads_from_catalogue(load_catalogue(artifact), requests, min_len, max_len, seed)
    queries = [Query([bundle.index_of[i] for i in p["history"]][-bundle.max_len:], k=10, candidates=10)
               for p in payloads]

    def padded(history: Any) -> Any:  # the previous path: one call on the batch as it comes
        return encoder.session.run(None, {"item_ids": np.ascontiguousarray(history.numpy())})[0]

    rows = []
    for size in BATCHES:
        batches = [_padded_histories(queries[s:s + size], bundle.max_len) for s in range(0, requests, size)]
        cpu = {"padded": 0.0, "grouped": 0.0}
        gap = 0.0
        for n in range(rounds):
            for history in batches:
                got = {}
                for path in ("padded", "grouped")[:: 1 if n % 2 else -1]:  # each path first every other round
                    t = time.thread_time()
                    got[path] = padded(history) if path == "padded" else encoder(history).numpy()
                    cpu[path] += time.thread_time() - t
                gap = max(gap, float(np.abs(got["padded"] - got["grouped"]).max()))
        per = {k: 1000 * v / (rounds * requests) for k, v in cpu.items()}
        rows.append({"batch": size, "padded_ms": round(per["padded"], 4), "grouped_ms": round(per["grouped"], 4),
                     "speedup": round(per["padded"] / per["grouped"], 3), "max_abs_diff": gap,
                     **_cosines(bundle, batches, candidates, rounds, requests)})
    return {"bundle": str(artifact), "version": bundle.version, "max_len": bundle.max_len, "requests": requests,
            "history": [min_len, max_len], "rounds": rounds, "candidates": candidates, "rows": rows}


def _cosines(bundle: Any, batches: list[Any], candidates: int, rounds: int, requests: int) -> dict[str, Any]:
    """CPU per request of the history cosines as one padded block and in length groups; bit-identical?"""
    vectors = bundle.vectors.numpy()
    cpu = {"padded": 0.0, "grouped": 0.0}
    identical = True
    for history in batches:
        user = torch.nn.functional.normalize(bundle.encode(history), dim=-1).numpy()
        _, found = bundle.artifact.index.search(user, candidates)
        hist = history.numpy()
        valid = hist != 0
        length = np.maximum(valid.sum(1), 1)
        cand_vec = vectors[np.where(found >= 0, found + 1, 0)]
        out = {k: {name: np.zeros(found.shape, dtype=np.float32) for name in COLUMNS} for k in cpu}
        for n in range(rounds):
            for path in ("padded", "grouped")[:: 1 if n % 2 else -1]:
                t = time.thread_time()
                if path == "padded":
                    similarity_block(out[path], slice(None), vectors, hist, valid, length, cand_vec)
                else:
                    similarity_features(out[path], vectors, hist, valid, length, cand_vec)
                cpu[path] += time.thread_time() - t
        identical &= all(np.array_equal(out["padded"][name], out["grouped"][name]) for name in COLUMNS)
    per = {k: 1000 * v / (rounds * requests) for k, v in cpu.items()}
    return {"cosines_padded_ms": round(per["padded"], 4), "cosines_grouped_ms": round(per["grouped"], 4),
            "cosines_speedup": round(per["padded"] / per["grouped"], 3), "cosines_identical": identical}


def to_markdown(report: dict[str, Any]) -> str:
    lo, hi = report["history"]
    head = ["batch", "encoder: one padded call (CPU ms/history)", "in length groups", "speed-up",
            "max |difference| of the user vectors", "history cosines: one padded block (CPU ms/request)",
            "in length groups", "speed-up", "features bit-identical"]
    body = [[r["batch"], r["padded_ms"], r["grouped_ms"], r["speedup"], f"{r['max_abs_diff']:.1e}",
             r["cosines_padded_ms"], r["cosines_grouped_ms"], r["cosines_speedup"],
             "yes" if r["cosines_identical"] else "NO"] for r in report["rows"]]
    title = f"# The compiled encoder and the history cosines on mixed history lengths: {report['bundle']}"
    return "\n".join([title, "",
                      f"{report['requests']} histories of {lo}-{hi} random catalogue items cut to the model's window "
                      f"({report['max_len']}), in batches; both paths alternate on the same batches "
                      f"({report['rounds']} rounds), in one process on one thread; the cosines over each history's "
                      f"{report['candidates']} retrieved candidates.", "",
                      markdown_table(head, body), ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=50)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--candidates", type=int, default=200)
    args = p.parse_args(argv)
    report = measure(args.artifact, requests=args.requests, min_len=args.min_len, max_len=args.max_len,
                     rounds=args.rounds, candidates=args.candidates)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"encoder-{args.artifact.name}"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2))
    text = to_markdown(report)
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
