"""Evaluation under the global temporal split (offline/data/temporal.py), with the ranks of the usual full-ranking
functions (offline/evaluation/evaluate.py: pessimistic ties, the repeat policy) and the metrics of common/metrics.py.

Per window it reports the headline metrics of the next item after the cut over the warm users, and apart: the
users counted (warm, cold), the targets that are new items (first seen at or after the cut) with the metrics on
them and on the known-item targets, and the recall over the window: per user, the share of the distinct items of
its window ranked within the top k (each item ranked by itself against every item, the user's history removed
under the exclude policy, so a window item repeating the history is a miss there), averaged over users.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.metrics import metrics_from_ranks
from offline.data.prepared import PreparedDataset
from offline.data.sequences import Sequences
from offline.data.split import Split
from offline.data.temporal import TemporalError, TemporalProtocol, TemporalSplit, Window, repeat_shares
from offline.evaluation.evaluate import EVAL_KS, Scorer, chunked_target_ranks, summarize, target_ranks
from offline.evaluation.retriever import check_catalogue, index_metrics
from retriever.artifact import load_artifact
from retriever.model import Retriever
from retriever.popularity import Popularity
from retriever.repeats import resolve_repeats

# (inputs, targets, description) -> (n,) pessimistic ranks of the targets.
RanksOf = Callable[[Sequences, np.ndarray, str], np.ndarray]


def scorer_ranks(scorer: Scorer, n_items: int, *, exclude_seen: bool, batch_size: int | None = None) -> RanksOf:
    """The ranks of a scorer over all items (a baseline such as popularity)."""
    return lambda inputs, targets, desc: target_ranks(scorer, inputs, targets, n_items, batch_size=batch_size,
                                                      exclude_seen=exclude_seen, desc=desc)


def retriever_ranks(model: Retriever, max_len: int, *, exclude_seen: bool, batch_size: int | None = None) -> RanksOf:
    """The ranks of a retriever's vectors, streamed over item blocks (as `dense_metrics`)."""
    model.eval()
    with torch.inference_mode():
        items = model.item_vectors()

    def ranks_of(inputs: Sequences, targets: np.ndarray, desc: str) -> np.ndarray:
        return chunked_target_ranks(model.user_vectors, items, inputs, targets, scale=model.temperature,
                                    batch_size=batch_size or 1024, max_len=max_len, exclude_seen=exclude_seen,
                                    desc=desc)
    return ranks_of


def temporal_metrics(split: TemporalSplit, ranks_of: RanksOf | dict[Split, RanksOf],
                     splits: Sequence[Split] = ("valid", "test"), ks: Sequence[int] = EVAL_KS) -> dict[str, Any]:
    """{"valid": headline, "test": headline, "temporal": {the split's record, and per window what is counted
    apart}}. ``ranks_of`` may differ per split (a test model refitted on everything before the test cut)."""
    out: dict[str, Any] = {}
    apart: dict[str, Any] = {key: value for key, value in split.record().items() if key not in ("valid", "test")}
    for name in splits:
        window = split.window(name)
        rank = ranks_of[name] if isinstance(ranks_of, dict) else ranks_of
        ranks = rank(window.inputs, window.targets, name)
        out[name] = summarize(ranks, ks)
        apart[name] = {**window.record(), **apart_metrics(window, ranks, ks),
                       "window_recall": window_recall(window, rank, ks, f"{name} window")}
    out["temporal"] = apart
    return out


def apart_metrics(window: Window, ranks: np.ndarray, ks: Sequence[int]) -> dict[str, Any]:
    new = window.new_items[window.targets]
    return {"known_item_target_metrics": summarize(ranks[~new], ks) if (~new).any() else None,
            "new_item_target_metrics": summarize(ranks[new], ks) if new.any() else None}


def window_recall(window: Window, ranks_of: RanksOf, ks: Sequence[int], desc: str) -> dict[str, float]:
    """{"Recall@k": mean over warm users of the share of their window's distinct items ranked within k}."""
    owner, items = window_pairs(window)
    return recall_from_ranks(window, owner, ranks_of(window.inputs.take(owner), items, desc), ks)


def window_pairs(window: Window) -> tuple[np.ndarray, np.ndarray]:
    """(owner, item): one pair per distinct item of each warm user's window, ``owner`` its row in the window."""
    owner = np.repeat(np.arange(len(window.users)), window.horizon.lengths)
    n_rows = int(window.new_items.shape[0])
    pairs = np.unique(owner * n_rows + window.horizon.items)
    return pairs // n_rows, pairs % n_rows


def recall_from_ranks(window: Window, owner: np.ndarray, ranks: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """`window_recall` from the ranks of the `window_pairs`."""
    per_user = np.bincount(owner, minlength=len(window.users)).astype(np.float64)
    hits = metrics_from_ranks(ranks, ks)
    return {f"Recall@{k}": round(float((np.bincount(owner, weights=hits[f"HR@{k}"], minlength=len(per_user))
                                        / per_user).mean()), 6) for k in ks}


def trained_under(path: Path, trained: Any, protocol: TemporalProtocol) -> dict[str, Any]:
    """The manifest's protocol record of the artifact at ``path``; refused unless it was trained under
    ``protocol``'s cuts (one trained under leave-one-out, or other cuts, learnt from the windows to be scored)."""
    if not protocol.matches(trained):
        how = "leave-one-out" if not isinstance(trained, dict) else (
            f"the cuts {trained.get('valid_cut')}/{trained.get('test_cut')}")
        raise TemporalError(f"{path} was trained under {how}, not under the temporal protocol asked for "
                            f"(cuts {protocol.valid_cut}/{protocol.test_cut}): its training "
                            "saw interactions of the windows it would be scored on; train it with the same flags")
    assert isinstance(trained, dict)
    return trained


def evaluate_artifact_temporal(path: Path, data: PreparedDataset, protocol: TemporalProtocol, *,
                               ks: tuple[int, ...] = EVAL_KS, use_index: bool = True,
                               batch_size: int | None = None) -> dict[str, Any]:
    """`seqrec evaluate --artifact --protocol temporal`: the artifact must have been trained under the same cuts
    (one trained under leave-one-out, or other cuts, learnt from the windows it would be scored on). Whether it
    was refitted is read from it: a refitted artifact learnt from the validation window too, so only its test
    window is scored."""
    artifact = load_artifact(path, with_index=use_index)
    check_catalogue(artifact, data)
    trained = trained_under(path, getattr(artifact.manifest, "protocol", None), protocol)
    protocol = replace(protocol, refit=bool(trained.get("refit")))
    split = protocol.split_data(data)
    splits: tuple[Split, ...] = ("test",) if protocol.refit else ("valid", "test")
    exclude_seen = artifact.manifest.exclude_seen
    ranks = retriever_ranks(artifact.model, artifact.max_len, exclude_seen=exclude_seen, batch_size=batch_size)
    result: dict[str, Any] = {"artifact": str(path), "version": artifact.manifest.version,
                              "protocol": protocol.record(), "repeats": artifact.manifest.repeats,
                              "repeat_targets": repeat_shares(split),
                              **temporal_metrics(split, ranks, splits, ks)}
    if use_index:
        index = index_metrics(artifact, split, splits, ks)  # type: ignore[arg-type]
        result["index"] = {"spec": artifact.manifest.index, **index}
    return result


def evaluate_popularity_temporal(data: PreparedDataset, protocol: TemporalProtocol, *, repeats: str = "auto",
                                 ks: tuple[int, ...] = EVAL_KS, batch_size: int | None = None) -> dict[str, Any]:
    """The popularity baseline under the temporal split: counts before the validation cut (before the test cut
    for the test window, with refit); ``repeats`` a policy of retriever/repeats.py ("auto": by the validation
    window's repeat share)."""
    split = protocol.split_data(data)
    shares = repeat_shares(split)
    policy = resolve_repeats(repeats, shares["valid"])
    exclude_seen = policy == "exclude"
    fitted = Popularity.fit(split.train.items, data.n_items)
    tested = Popularity.fit(split.refit_train.items, data.n_items) if protocol.refit else fitted
    ranks = {"valid": scorer_ranks(fitted.score, data.n_items, exclude_seen=exclude_seen, batch_size=batch_size),
             "test": scorer_ranks(tested.score, data.n_items, exclude_seen=exclude_seen, batch_size=batch_size)}
    return {"repeats": policy, "repeat_targets": shares,
            **temporal_metrics(split, ranks, ks=ks)}  # type: ignore[arg-type]
