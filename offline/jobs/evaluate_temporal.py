"""The two-stage `evaluate` of a bundle under the global temporal protocol (docs/temporal.md).

The same served system as leave-one-out's `offline.jobs.evaluate.evaluate_bundle` (the bundle's compiled encoder,
FAISS search under its repeat policy, the co-occurrence merge, the ranker's features and scores, the stable top
k), on other groups: each window's warm users, their history before the cut and their next item at or after it.
Beside the headline it reports what the temporal protocol counts apart (cold users, new-item targets) and the
recall over the window: every distinct item of a user's window ranked by the system's list for the history
before the cut (`offline.evaluation.temporal.window_pairs`), as the retriever's temporal figures count it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from offline.data.prepared import PreparedDataset
from offline.data.temporal import TemporalError, TemporalProtocol, TemporalSplit, Window, repeat_shares
from offline.evaluation.evaluate import EVAL_KS, summarize
from offline.evaluation.temporal import apart_metrics, recall_from_ranks, trained_under, window_pairs
from offline.jobs.evaluate import _retrieved, _System, _system, reranked_ranks
from ranker.train import Groups, retriever_ranks
from retriever.artifact import read_manifest


def evaluate_bundle_temporal(bundle: Path, data: PreparedDataset, protocol: TemporalProtocol, *,
                             ks: tuple[int, ...] = EVAL_KS) -> dict[str, Any]:
    """Metrics of the bundle's whole system on the validation and test windows (the retriever's own ranks within
    the candidates beside them), with the temporal record of each window. The bundle's retriever must have been
    trained under these cuts, without a refit (its validation figures would be those of a model that learnt the
    validation window)."""
    check_trained_under(bundle, protocol)
    split = protocol.split_data(data)
    system = _system(bundle, data, "auto", None, split)
    usable = tuple(k for k in ks if k <= system.depth)
    groups = _retrieved(system, data, ("valid", "test"), split)
    result: dict[str, Any] = {
        "artifact": str(bundle), "version": system.artifact.manifest.version, "stage": system.stage,
        "protocol": protocol.record(), "repeats": system.artifact.manifest.repeats,
        "repeat_targets": repeat_shares(split), "depth": system.depth,
        "ranker_depth": None if system.ranker is None else system.ranker.depth,
        f"recall@{system.depth}": {n: round(g.mined.recall(), 6) for n, g in groups.items()}}
    apart: dict[str, Any] = {key: value for key, value in split.record().items() if key not in ("valid", "test")}
    for name, g in groups.items():
        window = split.window(name)  # type: ignore[arg-type]
        ranks = reranked_ranks(system, g)
        result[name] = summarize(ranks, usable)
        apart[name] = {**window.record(), **apart_metrics(window, ranks, usable),
                       "window_recall": window_recall(system, window, g, usable)}
    result["temporal"] = apart
    if system.stage == "two-stage":
        assert system.ranker is not None
        result["ranker"] = {"kind": system.ranker.kind, "ids_masked": False}
        result["retriever"] = {name: summarize(retriever_ranks(g, system.n_items), usable)
                               for name, g in groups.items()}
    return result


def window_recall(system: _System, window: Window, groups: Groups, ks: tuple[int, ...]) -> dict[str, float]:
    """{"Recall@k"}: each distinct window item of a user ranked in the system's list for that user's history
    before the cut (the user's group, its request time the next item's, with the item as its target)."""
    owner, items = window_pairs(window)
    pairs = groups.subset(owner)
    pairs = replace(pairs, mined=replace(pairs.mined, target=items.astype(np.int64)))
    return recall_from_ranks(window, owner, reranked_ranks(system, pairs), ks)


def check_trained_under(bundle: Path, protocol: TemporalProtocol) -> None:
    """Refuse a bundle whose retriever was not trained under ``protocol``'s cuts, or was refitted."""
    trained = trained_under(bundle, getattr(read_manifest(bundle), "protocol", None), protocol)
    if trained.get("refit"):
        raise TemporalError(f"{bundle}'s retriever was refitted on everything before the test cut: the two-stage "
                            "path selects its ranker on the validation window, which that retriever learnt from; "
                            "train it without --refit")


def split_of(data: PreparedDataset, protocol: TemporalProtocol | None) -> TemporalSplit | None:
    """The temporal split the two-stage stages run on, or None for leave-one-out's."""
    return None if protocol is None else protocol.split_data(data)
