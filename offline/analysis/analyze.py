"""`seqrec analyze`: an HTML report on one or more trained models over the same prepared data.

1. item-embedding geometry (the xLSTM study): spectrum, intrinsic dimension, hubness, t-SNE, norms,
   anisotropy, linear CKA between the models (`offline.analysis.geometry`);
2. where each model wins (PCRec, KDD 2025): head vs long-tail targets and history-length buckets
   (`offline.evaluation.breakdown`);
3. readable predictions for a few users, retriever and reranked order (`offline.analysis.predictions`);
4. training curves from each artifact's ``history.jsonl``.

OUT/report.html links PNGs beside it; OUT/report.json holds every number they show. OUT is
written to a temporary sibling and renamed into place, so a failed run leaves the old report.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.atomic import replace_dir, staging_dir
from common.errors import SeqrecError
from common.folders import check_replaceable, enclosing_seqrec_folder
from offline.data.prepared import PreparedDataset
from offline.evaluation.breakdown import breakdown, model_ranks, training_counts
from retriever.artifact import RetrieverArtifact, load_artifact

log = logging.getLogger(__name__)

TSNE_LEGEND = 8  # most frequent labels coloured; the rest are "other"


@dataclass(frozen=True)
class AnalyzeOptions:
    k: int = 10  # hubness neighbours
    head_share: float = 0.2
    length_edges: tuple[int, ...] = ()  # empty: quantile buckets
    length_buckets: int = 5
    users: int = 5
    user_ids: tuple[str, ...] = ()
    tsne_items: int = 2000
    seed: int = 0


def model_labels(paths: Sequence[Path]) -> list[str]:
    """Each artifact's folder name, made unique with its position when two folders share a name."""
    names = [p.resolve().name for p in paths]
    repeated = {n for n, c in Counter(names).items() if c > 1}
    return [f"{n} ({i + 1})" if n in repeated else n for i, n in enumerate(names)]


def load_models(paths: Sequence[Path], data: PreparedDataset) -> dict[str, RetrieverArtifact]:
    from offline.evaluation.retriever import check_catalogue

    models = {}
    for label, path in zip(model_labels(paths), paths, strict=True):
        artifact = load_artifact(path)
        check_catalogue(artifact, data)
        models[label] = artifact
    return models


def item_vectors(artifact: RetrieverArtifact) -> np.ndarray:
    """(n_items, D) float64 item embeddings as the encoder makes them, padding row dropped.

    These are taken before the retriever's cosine projection: a cosine model scores with their unit
    versions, so its norms would all read 1; the directions (hubness, anisotropy, t-SNE) are the same.
    """
    with torch.inference_mode():
        return artifact.model.encoder.item_embeddings()[1:].double().cpu().numpy()


def training_curve(artifact: RetrieverArtifact) -> list[dict[str, Any]]:
    """Per-epoch loss, validation NDCG@10 and learning rate from the artifact's history.jsonl ([] when absent)."""
    path = artifact.path / "history.jsonl"
    if not path.exists():
        log.warning("%s: no history.jsonl; no training curve for it", artifact.path)
        return []
    points = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        points.append({"epoch": record.get("epoch"), "loss": record.get("loss"), "lr": record.get("lr"),
                       "valid_ndcg@10": (record.get("valid") or {}).get("NDCG@10")})
    return points


def item_labels(data: PreparedDataset) -> tuple[str, list[str]]:
    """The metadata column used for colour and each item's main label (its first value; "none" without one)."""
    from offline.analysis.predictions import item_metadata

    column, values = item_metadata(data)
    return column or "none", [v[0] if v else "none" for v in values]


def tsne_section(vectors: Mapping[str, np.ndarray], data: PreparedDataset, counts: np.ndarray,
                 options: AnalyzeOptions) -> dict[str, Any]:
    """The same seeded item sample projected for every model, with each item's label and popularity."""
    from offline.analysis.geometry import tsne_2d

    n = data.n_items
    sample = np.sort(np.random.default_rng(options.seed).choice(n, size=min(options.tsne_items, n), replace=False))
    column, labels = item_labels(data)
    picked = [labels[i] for i in sample]
    legend = [name for name, _ in Counter(picked).most_common(TSNE_LEGEND)]
    shown = [name if name in legend else "other" for name in picked]
    if "other" in shown:
        legend.append("other")
    models = {}
    for label, v in vectors.items():
        log.info("t-SNE of %s (%d items)", label, len(sample))
        models[label] = np.round(tsne_2d(v[sample], seed=options.seed), 4).tolist()
    return {"items": [str(data.item_ids[i + 1]) for i in sample], "colour_by": column, "legend": legend,
            "label": shown, "popularity": counts[sample + 1].tolist(), "models": models}


def cka_section(vectors: Mapping[str, np.ndarray]) -> dict[str, Any]:
    from offline.analysis.geometry import linear_cka

    labels = list(vectors)
    matrix = [[1.0 if a == b else round(linear_cka(vectors[a], vectors[b]), 6) for b in labels] for a in labels]
    return {"models": labels, "matrix": matrix}


def build_report(paths: Sequence[Path], data: PreparedDataset, options: AnalyzeOptions) -> dict[str, Any]:
    """Every figure's numbers, as the JSON written beside the report."""
    from offline.analysis.geometry import geometry
    from offline.analysis.predictions import pick_users, readable_predictions

    models = load_models(paths, data)
    split = data.split()
    counts = training_counts(split, data.n_items)
    vectors = {label: item_vectors(a) for label, a in models.items()}
    log.info("embedding geometry of %d model(s)", len(models))
    report: dict[str, Any] = {
        "data": {"path": str(data.path), "users": data.n_users, "items": data.n_items},
        "options": {**options.__dict__, "length_edges": list(options.length_edges), "user_ids": list(options.user_ids)},
        "models": [{"label": label, "path": str(a.path), "version": a.manifest.version,
                    "backbone": a.config.model.backbone, "similarity": a.config.model.similarity,
                    "metrics": a.manifest.metrics}
                   for label, a in models.items()],
        "geometry": {label: geometry(v, k=options.k) for label, v in vectors.items()},
        "cka": cka_section(vectors),
        "tsne": tsne_section(vectors, data, counts, options),
    }
    ranks = {label: model_ranks(a, split) for label, a in models.items()}
    report["breakdown"] = breakdown(ranks, split, data.n_items, head_share=options.head_share,
                                    edges=options.length_edges, n_buckets=options.length_buckets)
    rows = pick_users(data, options.users, options.seed, options.user_ids)
    report["predictions"] = readable_predictions(models, data, rows)
    report["curves"] = {label: training_curve(a) for label, a in models.items()}
    return report


def write_report(report: Mapping[str, Any], out: Path) -> list[str]:
    """report.json, the PNGs and report.html into ``out`` (replaced as a whole); returns the PNG names."""
    from offline.analysis.report import draw_all, render_html

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out)
    try:
        images = draw_all(report, staging)
        (staging / "report.json").write_text(json.dumps(report, separators=(",", ":")) + "\n")  # large arrays
        (staging / "report.html").write_text(render_html(report, images))
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return images


def check_options(args: argparse.Namespace) -> AnalyzeOptions:
    if not 0.0 < args.head_share < 1.0:
        raise SeqrecError(f"--head-share must be between 0 and 1 (exclusive), got {args.head_share}")
    for flag, value, low in (("--k", args.k, 1), ("--users", args.users, 0), ("--tsne-items", args.tsne_items, 5),
                             ("--length-buckets", args.length_buckets, 1)):
        if value < low:
            raise SeqrecError(f"{flag} must be at least {low}, got {value}")
    edges: tuple[int, ...] = ()
    if args.length_edges:
        try:
            edges = tuple(int(e) for e in args.length_edges.split(","))
        except ValueError:
            raise SeqrecError(f"--length-edges must be comma-separated integers, got {args.length_edges!r}") from None
    user_ids = tuple(u for u in (args.user_ids or "").split(",") if u)
    return AnalyzeOptions(k=args.k, head_share=args.head_share, length_edges=edges, length_buckets=args.length_buckets,
                          users=args.users, user_ids=user_ids, tsne_items=args.tsne_items, seed=args.seed)


def run_analyze(args: argparse.Namespace) -> int:
    from threadpoolctl import threadpool_limits

    from offline.data.prepared import load_prepared

    options = check_options(args)
    above = enclosing_seqrec_folder(args.out)
    if above is not None:  # inside a bundle it broke nothing, but inside a dataset it blocked `prepare --overwrite`
        raise SeqrecError(f"--out {args.out} is inside {above[0]}, {above[1]}; write the report outside it")
    check_replaceable(args.out, lambda folder: (folder / "report.json").is_file(), "a seqrec analyze report")
    data = load_prepared(args.data)
    if options.k >= data.n_items:
        raise SeqrecError(f"--k must be below the number of items ({data.n_items})")
    # t-SNE and FAISS use OpenMP/BLAS pools of their own; --threads caps them too.
    with threadpool_limits(limits=args.threads):
        report = build_report([args.artifact, *args.compare], data, options)
    images = write_report(report, args.out)
    print(f"report -> {args.out / 'report.html'} ({len(images)} figures; numbers in report.json)")
    return 0
