"""Where one request's model time goes, in this process (no HTTP): `seqrec bench serve` measures the whole.

    python -m offline.bench.compute.serve_stages --artifact BUNDLE --out docs/results/serve [--requests 300]

For single requests (batch 1, the low-load case) over random catalogue histories: the medians of each
stage of `service.system.recommend.recommend_batch` (wall time, from ``timing_ms``, and the whole call's CPU time)
with the stored-user cache missed (a new history) and hit (the same user and history again); then the
CPU time of each part timed apart (encoder, FAISS, the ranker's features, its scores), and two costs of
exactness measured side by side on the same inputs (and the HTTP side's choices: ids validated per id or at
once, the response written by pydantic or orjson): the history cosines in float64 (what the features
use, for batch invariance) against float32, and LightGBM fed the float32 matrix against a float64 copy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from pydantic import TypeAdapter
from tqdm import tqdm

from offline.bench.lib.measure import median_cpu_ms
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.cli.common import SEED
from offline.tables import markdown_table
from ranker.features import compute_features
from service.http.engine import set_threads
from service.http.schemas import ItemId, ItemIds, RecommendResponse
from service.system.bundle import Bundle
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch


def _queries(bundle: Bundle, payloads: list[dict[str, Any]], depth: int) -> list[Query]:
    return [Query([bundle.index_of[i] for i in p["history"]][-bundle.max_len:], k=10, candidates=depth)
            for p in payloads]


def _stage_medians(bundle: Bundle, queries: list[Query], user: bool) -> dict[str, float]:
    """Median stage times of batch-1 requests; with ``user``, each asked twice and the second (a hit) kept."""
    stages: dict[str, list[float]] = {}
    for n, q in enumerate(tqdm(queries, desc="hit" if user else "miss", unit="request", leave=False)):
        if user:
            q = Query(q.history, k=q.k, candidates=q.candidates, user=f"bench-{n}")
            recommend_batch(bundle, [q])
        t, cpu = time.perf_counter(), time.thread_time()
        (result,) = recommend_batch(bundle, [q])
        total = {"total": 1000 * (time.perf_counter() - t), "total_cpu": 1000 * (time.thread_time() - cpu)}
        for name, ms in {**result.timing_ms, **total}.items():
            stages.setdefault(name, []).append(ms)
    return {name: round(float(np.median(v)), 4) for name, v in stages.items()}


def _exactness_costs(bundle: Bundle, queries: list[Query], reps: int) -> dict[str, float]:
    """Features and ranker timed apart; float64 against float32 cosines; float32 against float64 LightGBM rows."""
    assert bundle.tables is not None
    assert bundle.ranker is not None
    (q,) = queries[:1]
    history = torch.tensor([[0] * (bundle.max_len - len(q.history)) + q.history])
    user = torch.nn.functional.normalize(bundle.encode(history), dim=-1)
    scores, rows = bundle.artifact.index.search(user.numpy(), q.candidates)  # type: ignore[union-attr]
    cand = torch.from_numpy(np.where(rows >= 0, rows + 1, 0))
    score = torch.from_numpy(np.where(rows >= 0, scores, 0.0))
    index, tables = bundle.artifact.index, bundle.tables
    with torch.inference_mode():
        encode = median_cpu_ms(lambda: bundle.encode(history), reps)
        search = median_cpu_ms(lambda: index.search(user.numpy(), q.candidates), reps)  # type: ignore[union-attr]
        batch = compute_features(tables, bundle.vectors, history, user, cand, score)
        hist_vec, cand_vec = bundle.vectors[history], bundle.vectors[cand]
        features = median_cpu_ms(lambda: compute_features(tables, bundle.vectors, history, user, cand, score), reps)
        out = {"encode": encode, "search": search, "features": features,
               "ranker": median_cpu_ms(lambda: bundle.ranker.ranker.score(batch), reps),  # type: ignore[union-attr]
               "cosines_float64": median_cpu_ms(lambda: torch.einsum("bnd,btd->bnt", cand_vec.double(),
                                                                  hist_vec.double()), reps),
               "cosines_float32": median_cpu_ms(lambda: torch.einsum("bnd,btd->bnt", cand_vec, hist_vec), reps)}
    booster = getattr(bundle.ranker.ranker, "booster", None)
    if booster is not None:
        flat = batch.dense.reshape(-1, batch.dense.shape[-1]).numpy()
        f32, f64 = np.ascontiguousarray(flat, dtype=np.float32), flat.astype(np.float64)
        out["lgbm_float32_rows"] = median_cpu_ms(lambda: booster.predict(f32, num_threads=1), reps)
        out["lgbm_float64_rows"] = median_cpu_ms(lambda: booster.predict(f64, num_threads=1), reps)
        out["lgbm_identical"] = float(np.array_equal(booster.predict(f32, num_threads=1),
                                                     booster.predict(f64, num_threads=1)))
    return out


def _http_costs(bundle: Bundle, queries: list[Query], reps: int) -> dict[str, float]:
    """CPU of the HTTP-side choices: a 200-id history validated per id or at once, the response body validated
    and written by pydantic or written by orjson."""
    ids = [bundle.external(i) for i in queries[0].history]
    per_id, at_once = TypeAdapter(list[ItemId]), TypeAdapter(ItemIds)
    (result,) = recommend_batch(bundle, queries[:1])
    items = [{"item_id": bundle.external(i), "score": s, "retrieval_score": r, "rank": n + 1,
              **bundle.metadata[i - 1]} for n, (i, s, r) in enumerate(result.items)]
    body = {"items": items, "model_version": bundle.version, "reranked": True, "unknown_items": [],
            "fallback": None, "history_used": len(ids), "timing_ms": {**result.timing_ms, "queue": 0.0, "total": 1.0}}
    response = TypeAdapter(RecommendResponse)
    return {f"validate_{len(ids)}_ids_per_id": median_cpu_ms(lambda: per_id.validate_python(ids), reps),
            f"validate_{len(ids)}_ids_at_once": median_cpu_ms(lambda: at_once.validate_python(ids), reps),
            "response_pydantic": median_cpu_ms(lambda: response.dump_json(response.validate_python(body)), reps),
            "response_orjson": median_cpu_ms(lambda: orjson.dumps(body), reps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--seed", type=SEED, default=0)
    args = p.parse_args(argv)
    set_threads(1)
    bundle = load_bundle(args.artifact)
    depth = bundle.default_candidates(10)
    payloads = payloads_from_catalogue(load_catalogue(args.artifact), args.requests, args.max_len, args.max_len,
                                       args.seed)
    queries = _queries(bundle, payloads, depth)
    recommend_batch(bundle, queries[:8])  # warm-up
    report = {"bundle": str(args.artifact), "version": bundle.version, "candidates": depth,
              "history": args.max_len, "requests": args.requests,
              "miss": _stage_medians(bundle, queries, user=False), "hit": _stage_medians(bundle, queries, user=True)}
    report["parts"] = _http_costs(bundle, queries, args.requests)
    if bundle.ranker is not None:
        report["parts"].update(_exactness_costs(bundle, queries, args.requests))
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"stages-{args.artifact.name}"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2))
    text = stages_markdown(report)
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0


def stages_markdown(report: dict[str, Any]) -> str:
    stages = list(report["miss"])
    rows = [[path, *(report[path][s] for s in stages)] for path in ("miss", "hit")]
    lines = [f"# Stages of one request: {report['bundle']}", "",
             f"Batch 1, histories of {report['history']} random catalogue items, k=10, {report['candidates']} "
             f"candidates; medians over {report['requests']} requests (ms), in-process, 1 thread. Stages are wall "
             "time (on a shared machine, mostly waiting for a core); total_cpu is this thread's CPU time.", "",
             markdown_table(["stored-user cache", *stages], rows)]
    if "parts" in report:
        lines += ["", "Each part alone, CPU time of this thread (median ms):", "",
                  markdown_table(["part", "median CPU ms"], [[k, v] for k, v in report["parts"].items()])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
