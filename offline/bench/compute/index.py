"""`seqrec bench index`: exact against approximate FAISS indexes at a given catalogue size.

For each catalogue size the same vectors go into a flat (exact) index and into each approximate
structure of :mod:`retriever.index`; every approximate one is swept over its search parameter
(HNSW ``efSearch``, IVF ``nprobe``) and measured on the same held-out queries:

* build seconds (``--build-threads``), and size in bytes of the serialised index (what the
  bundle ships and, within a few percent, what a server holds in memory);
* recall@k against the flat index's exact top-k (k = 100 by default);
* batch-1 latency (p50 and p99 over ``--latency-queries`` single-query searches) and the
  median time of a batch of 64 queries, both on ``--threads`` search threads.

The cheapest setting of each structure that reaches ``--target-recall`` is marked, and the
fastest of those at batch 1 is the size's recommendation.

Vectors: a trained bundle's item vectors (``--artifact``, queries are the same vectors with
noise), a ``.npy`` file (``--vectors``), or a synthetic catalogue: ``clustered`` draws items
around sqrt(n) centres with a power-law spectrum (the shape of learned item embeddings: a few
strong directions, groups of similar items), ``gaussian`` an isotropic cloud, the hardest case
for graph and cell indexes because nothing in it is near anything. Queries are fresh draws
from the same distribution, never members of the index. Everything is L2-normalised, as the
service's cosine retriever does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal

import faiss
import numpy as np
from tqdm import tqdm

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.lib.args import parse_ints
from offline.tables import markdown_table
from retriever.index import IndexSpec, build_index, normalize, set_search_params

log = logging.getLogger(__name__)

Distribution = Literal["clustered", "gaussian"]
BATCH = 64
HNSW_EF = (16, 32, 64, 128, 256, 512, 1024)
IVF_NPROBE = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STRUCTURES = ("flat", "hnsw", "ivf", "ivfpq")


def synthetic_vectors(n: int, dim: int, distribution: Distribution, seed: int, *,
                      spread: float = 1.0, n_clusters: int | None = None) -> np.ndarray:
    """(n, dim) float32 unit vectors; ``clustered``: centre + spread * noise, both with a 1/sqrt(j) spectrum.

    The centres are drawn from their own generator (seeded by ``seed`` alone), so catalogue and queries
    drawn with different ``seed`` offsets but the same ``n_clusters`` share them.
    """
    rng = np.random.default_rng(seed)
    if distribution == "gaussian":
        return normalize(rng.standard_normal((n, dim), dtype=np.float32))
    scale = (np.arange(1, dim + 1, dtype=np.float32) ** -0.25)  # variance ~ 1/sqrt(j)
    scale /= np.sqrt(np.mean(scale**2))
    clusters = n_clusters or max(1, round(math.sqrt(n)))
    centres = np.random.default_rng(0).standard_normal((clusters, dim), dtype=np.float32) * scale
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 262_144):  # chunks keep the temporary noise matrix small at 10^6 items
        m = min(n, start + 262_144) - start
        owner = rng.integers(0, clusters, m)
        out[start:start + m] = centres[owner] + spread * rng.standard_normal((m, dim), dtype=np.float32) * scale
    return normalize(out)


def noisy_queries(vectors: np.ndarray, n: int, seed: int, noise: float = 0.3) -> np.ndarray:
    """Queries near (not at) catalogue vectors, for a real catalogue that has no query distribution."""
    rng = np.random.default_rng(seed)
    base = vectors[rng.integers(0, len(vectors), n)]
    jitter = rng.standard_normal(base.shape, dtype=np.float32) * (noise / math.sqrt(vectors.shape[1]))
    return normalize(base + jitter)


def structure_spec(structure: str, n: int, dim: int) -> IndexSpec:
    """The index built for one structure at ``n`` items (search parameters are swept afterwards)."""
    if structure == "flat":
        return IndexSpec(kind="flat")
    if structure == "hnsw":
        return IndexSpec(kind="hnsw", hnsw_m=32, ef_construction=128)
    if structure == "ivf":
        return IndexSpec(kind="ivf")
    if structure == "ivfpq":
        return IndexSpec(kind="ivf", pq_m=next(m for m in (dim // 2, dim // 4, 8, 4, 2, 1) if m and dim % m == 0))
    raise SeqrecError(f"unknown index structure {structure!r}; expected one of {', '.join(STRUCTURES)}")


def sweep_values(spec: IndexSpec, n: int) -> list[tuple[str, int]]:
    if spec.kind == "hnsw":
        return [("ef_search", ef) for ef in HNSW_EF]
    if spec.kind == "ivf":
        nlist = spec.nlist or max(1, min(round(4 * math.sqrt(n)), n // 39))
        return [("nprobe", p) for p in IVF_NPROBE if p <= nlist]
    return [("exact", 0)]


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / k (row ids; -1 padding never matches)."""
    k = truth.shape[1]
    hits = sum(np.intersect1d(f[f >= 0], t, assume_unique=True).size for f, t in zip(found, truth, strict=True))
    return hits / (k * len(truth))


def time_queries(index: faiss.Index, queries: np.ndarray, k: int, n_single: int) -> dict[str, float]:
    """Batch-1 p50/p99 over the first n_single queries, median of batches of 64 over all of them."""
    single = []
    for q in queries[:n_single]:
        started = time.perf_counter()
        index.search(q[None, :], k)
        single.append(time.perf_counter() - started)
    batched = []
    for start in range(0, len(queries) - BATCH + 1, BATCH):
        started = time.perf_counter()
        index.search(queries[start:start + BATCH], k)
        batched.append(time.perf_counter() - started)
    return {
        "batch1_p50_ms": 1000 * float(np.percentile(single, 50)),
        "batch1_p99_ms": 1000 * float(np.percentile(single, 99)),
        "batch64_ms": 1000 * float(np.median(batched)) if batched else math.nan,
    }


def measure_size(vectors: np.ndarray, queries: np.ndarray, structures: Sequence[str], *, k: int,
                 target: float, threads: int, build_threads: int, n_single: int, seed: int,
                 max_latency_ms: float) -> dict[str, Any]:
    n, dim = vectors.shape
    faiss.omp_set_num_threads(build_threads)
    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    _, truth = exact.search(queries, k)
    rows: list[dict[str, Any]] = []
    for structure in structures:
        spec = structure_spec(structure, n, dim)
        faiss.omp_set_num_threads(build_threads)
        started = time.perf_counter()
        index = exact if structure == "flat" else build_index(vectors, spec, seed=seed)
        build_s = 0.0 if structure == "flat" else time.perf_counter() - started
        size = int(faiss.serialize_index(index).size)
        faiss.omp_set_num_threads(threads)
        previous = -1.0
        for name, value in tqdm(sweep_values(spec, n), desc=f"{n:,} {structure}", unit="setting", leave=False):
            if name == "ef_search":
                set_search_params(index, dataclasses.replace(spec, ef_search=value))
            elif name == "nprobe":
                set_search_params(index, dataclasses.replace(spec, nprobe=value))
            _, found = index.search(queries, k)
            recall = round(recall_at(found, truth), 5)
            row: dict[str, Any] = {
                "structure": structure, "spec": spec.to_dict() | ({name: value} if name != "exact" else {}),
                "param": name, "value": value, "build_s": round(build_s, 2), "size_bytes": size,
                f"recall@{k}": recall,
                **{key: round(v, 4) for key, v in time_queries(index, queries, k, n_single).items()},
            }
            rows.append(row)
            log.info("%s items %s %s=%s: recall@%d %.4f, batch-1 p50 %.3f ms", f"{n:,}", structure, name, value, k,
                     recall, row["batch1_p50_ms"])
            # Stop when more effort buys nothing (near-exact, or a plateau: PQ's quantisation error caps recall)
            # or when the setting is already far too slow to serve.
            if recall >= 0.999 or recall - previous < 0.0005 or row["batch1_p50_ms"] > max_latency_ms:
                break
            previous = recall
        del index
    return {"n_items": n, "dim": dim, "k": k, "rows": rows, "choice": choose(rows, k, target)}


def choose(rows: Sequence[dict[str, Any]], k: int, target: float) -> dict[str, Any] | None:
    """The cheapest setting per structure reaching the target, then the fastest of those at batch 1."""
    cheapest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row[f"recall@{k}"] >= target and row["structure"] not in cheapest:
            cheapest[row["structure"]] = row
    approximate = [r for r in cheapest.values() if r["structure"] != "flat"] or list(cheapest.values())
    return min(approximate, key=lambda r: r["batch1_p50_ms"]) if approximate else None


def markdown(report: dict[str, Any]) -> str:
    k, target = report["k"], report["target_recall"]
    lines = [f"# Index benchmark ({report['source']})", "",
             f"{report['queries']:,} queries (never in the index), recall@{k} against exact search; batch-1 "
             f"latency over {report['latency_queries']} single queries; search on {report['threads']} thread(s), "
             f"build on {report['build_threads']}. Bold: the recommended setting (target recall@{k} >= {target}).",
             ""]
    for size in report["sizes"]:
        choice = size["choice"]
        head = ["index", "setting", "build s", "size MB", f"recall@{k}", "batch-1 p50 ms", "batch-1 p99 ms",
                "batch-64 ms"]
        rows = []
        for row in size["rows"]:
            setting = "exact" if row["param"] == "exact" else f"{row['param']}={row['value']}"
            mark = "**" if row is choice else ""
            rows.append([f"{mark}{row['structure']}{mark}", setting, f"{row['build_s']:.1f}",
                         f"{row['size_bytes'] / 2**20:.0f}", f"{row[f'recall@{k}']:.4f}", f"{row['batch1_p50_ms']:.3f}",
                         f"{row['batch1_p99_ms']:.3f}", f"{row['batch64_ms']:.2f}"])
        lines += [f"## {size['n_items']:,} items, dim {size['dim']}", "", markdown_table(head, rows)]
        verdict = ("no approximate setting reached the target" if choice is None else
                   f"recommended: {choice['structure']} {choice['param']}={choice['value']} "
                   f"(recall@{k} {choice[f'recall@{k}']:.4f}, batch-1 p50 {choice['batch1_p50_ms']:.3f} ms)")
        lines += ["", verdict, ""]
    lines += [f"Reproduce: `{report['command']}`", ""]
    return "\n".join(lines)


def load_source(args: argparse.Namespace, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(catalogue, queries, description) for one size."""
    if args.artifact is not None or args.vectors is not None:
        if args.vectors is not None:
            try:
                vectors = np.load(args.vectors, allow_pickle=False)
            except (OSError, ValueError) as err:
                raise SeqrecError(f"cannot read {args.vectors} as a .npy matrix: {err}") from err
            source = f"vectors from {args.vectors}"
        else:
            from retriever.artifact import item_matrix, load_artifact

            vectors = item_matrix(load_artifact(args.artifact, with_index=False).model)
            source = f"item vectors of {args.artifact}"
        if vectors.ndim != 2:
            raise SeqrecError(f"expected an (n, d) matrix, got shape {vectors.shape}")
        vectors = normalize(vectors[:n])
        return vectors, noisy_queries(vectors, args.queries, args.seed + 1), source
    clusters = max(1, round(math.sqrt(n)))
    vectors = synthetic_vectors(n, args.dim, args.distribution, args.seed, spread=args.spread, n_clusters=clusters)
    queries = synthetic_vectors(args.queries, args.dim, args.distribution, args.seed + 10_007, spread=args.spread,
                                n_clusters=clusters)
    shape = f"clustered (spread {args.spread:g})" if args.distribution == "clustered" else "gaussian"
    return vectors, queries, f"synthetic {shape} vectors, dim {args.dim}"


def run_index_bench(args: argparse.Namespace) -> int:
    sizes = parse_ints(args.sizes, "--sizes")
    structures = [s.strip() for s in args.structures.split(",") if s.strip()]
    for s in structures:
        structure_spec(s, 1000, 64)  # validates the name
    if "flat" not in structures:
        structures.insert(0, "flat")
    if not 0 < args.target_recall <= 1:
        raise SeqrecError(f"--target-recall must be in (0, 1], got {args.target_recall}")
    if args.k < 1 or args.queries < args.k:
        raise SeqrecError("--k must be >= 1 and --queries at least --k")
    results, source = [], ""
    for n in sizes:
        vectors, queries, source = load_source(args, n)
        if len(vectors) < max(args.k, 2):
            raise SeqrecError(f"{len(vectors)} vectors cannot answer top-{args.k} queries")
        log.info("%s: %d x %d catalogue, %d queries", source, *vectors.shape, len(queries))
        results.append(measure_size(
            vectors, queries, structures, k=args.k, target=args.target_recall, threads=args.threads,
            build_threads=args.build_threads, n_single=min(args.latency_queries, len(queries)), seed=args.seed,
            max_latency_ms=args.max_latency_ms))
    report = {
        "source": source, "k": args.k, "target_recall": args.target_recall, "queries": args.queries,
        "latency_queries": args.latency_queries, "threads": args.threads, "build_threads": args.build_threads,
        "faiss_version": faiss.__version__, "command": "seqrec " + shlex.join(sys.argv[1:]), "sizes": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "index.json", lambda p: p.write_text(json.dumps(report, indent=2) + "\n"))
    text = markdown(report)
    atomic_write(args.out / "index.md", lambda p: p.write_text(text))
    print(text)
    return 0
