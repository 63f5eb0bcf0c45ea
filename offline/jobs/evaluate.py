"""`seqrec evaluate` of a bundle: retriever top-N -> ranker -> top-K on the validation and test users,
with the exclusion, depth and features the service uses (the parity bench compares the two), and the
catalogue the service serves: the bundle's journal of items retired and added (`service.system.catalog`) applied."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from offline.evaluation.evaluate import EVAL_KS, summarize
from offline.evaluation.retriever import repeat_record
from offline.evaluation.two_stage import Reranked, rerank_groups
from offline.jobs.mine import merge_groups, mine
from offline.jobs.rank import bundle_source
from offline.jobs.splits import AnySplit, split_plans, split_sources
from offline.jobs.tables import has_clock, request_times
from ranker.artifact import RankerArtifact, load_ranker
from ranker.config import MAX_DEPTH, ranker_default
from ranker.train import (
    FeatureSource,
    Groups,
    UnrankableScores,
    make_groups,
    retriever_ranks,
)
from retriever.artifact import RetrieverArtifact, retrieval_rows
from service.system.catalog import load_served, pending, read_journal
from service.system.encode import RawEncoder, raw_user_vectors
from service.system.loader import compile_stages

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
META_COLUMNS = ("genres", "attributes")


def evaluate_bundle(bundle: Path, data: PreparedDataset, *, stage: str = "auto", depth: int | None = None,
                    mask_ids: bool = False, ks: tuple[int, ...] = EVAL_KS,
                    splits: tuple[str, ...] = ("valid", "test")) -> dict[str, Any]:
    """Metrics of the whole system the bundle holds: retriever top-N -> ranker -> top-K.

    Full-ranking semantics: a target outside the retriever's top N counts as a miss, so
    the metrics are comparable with `seqrec evaluate` of the retriever alone. N (``depth``)
    defaults to the ranker's: the depth it was mined, trained and selected at.
    """
    system = _system(bundle, data, stage, depth)
    usable = tuple(k for k in ks if k <= system.depth)
    deeper = ",".join(str(k) for k in ks if k > system.depth)
    if deeper:
        # A request for such a k retrieves k candidates, not `depth` (service.system.recommend): another system.
        hint = f"--candidates {max(ks)} (a request's `candidates`) measures {'them' if ',' in deeper else 'it'}"
        if not usable:
            raise SeqrecError(f"--ks {deeper}: above the {system.depth} candidates the list ranks; {hint}")
        log.warning("--ks: %s left out, above the %d candidates the list ranks; %s", deeper, system.depth, hint)
    groups = _retrieved(system, data, splits)
    result: dict[str, Any] = {"artifact": str(bundle), "version": system.artifact.manifest.version,
                              "stage": system.stage, **repeat_record(system.artifact, data), "depth": system.depth,
                              "ranker_depth": None if system.ranker is None else system.ranker.depth,
                              f"recall@{system.depth}": {n: round(g.mined.recall(), 6) for n, g in groups.items()}}
    if system.catalogue:
        result["catalogue"] = system.catalogue
    for name, g in groups.items():
        result[name] = summarize(_reranked(system, g, k=1, mask_ids=mask_ids).ranks, usable)
    if system.stage == "two-stage":
        assert system.ranker is not None
        result["ranker"] = {"kind": system.ranker.kind, "ids_masked": mask_ids}
        result["retriever"] = {name: summarize(retriever_ranks(g, system.n_items), usable)
                               for name, g in groups.items()}
    return result


def served_index_metrics(bundle: Path, data: PreparedDataset, ks: tuple[int, ...] = EVAL_KS) -> dict[str, Any] | None:
    """The retriever's metrics through the FAISS index as the service retrieves, with the bundle's catalogue journal
    applied (items retired and added through the admin routes); None when the journal holds no change (then
    `offline.evaluation.retriever.index_metrics` of the artifact is the served figure)."""
    changes = read_journal(bundle)
    if not (changes.added or changes.retired):
        return None
    served = evaluate_bundle(bundle, data, stage="retriever", depth=max(ks), ks=ks)
    return {key: served[key] for key in ("catalogue", "valid", "test")}


def two_stage_top(bundle: Path, data: PreparedDataset, *, split: str = "test", k: int = 10,
                  depth: int | None = None) -> tuple[Reranked, np.ndarray]:
    """Each ``split`` user's top k as `evaluate_bundle` ranks them (its ranks too), and the targets."""
    system = _system(bundle, data, "auto", depth)
    groups = _retrieved(system, data, (split,))[split]
    return _reranked(system, groups, k=k), groups.mined.target


def retrieved_groups(bundle: Path, data: PreparedDataset,
                     splits: tuple[str, ...] = ("valid", "test")) -> tuple[_System, dict[str, Groups]]:
    """The served system of ``bundle`` and each split's groups as `evaluate_bundle` scores them."""
    system = _system(bundle, data, "auto", None)
    return system, _retrieved(system, data, splits)


def reranked_ranks(system: _System, groups: Groups) -> np.ndarray:
    """(G,) each target's rank as `evaluate_bundle` counts it, for groups of `retrieved_groups` (altered or not)."""
    return _reranked(system, groups, k=1).ranks


@dataclass(frozen=True)
class _System:
    artifact: RetrieverArtifact
    ranker: RankerArtifact | None  # None: the retriever alone ranks
    source: FeatureSource
    stage: str
    depth: int
    encode: RawEncoder  # the served user encoder (compiled where the service compiles it)
    n_items: int  # the served catalogue: the trained items and those added since with a vector
    banned: np.ndarray  # internal ids the service never returns: the catalogue's retired items
    catalogue: dict[str, int]  # the journal's changes as applied ({} without any)


def _system(bundle: Path, data: PreparedDataset, stage: str, depth: int | None,
            split: AnySplit | None = None) -> _System:
    artifact, source = bundle_source(bundle, data, split)
    ranker_artifact = load_ranker(bundle, artifact.manifest)
    if stage == "auto":
        stage = "two-stage" if ranker_artifact is not None else "retriever"
    if stage == "two-stage" and ranker_artifact is None:
        raise SeqrecError(f"{bundle} holds no ranker; train one with `seqrec train-ranker` or use --stage retriever")
    depth = depth or (ranker_artifact.depth if ranker_artifact else ranker_default("depth"))
    if depth > MAX_DEPTH:  # below, any depth a request may ask for (cut-offs above it are left out, with a warning)
        raise SeqrecError(f"--candidates must be at most {MAX_DEPTH} (the most a request's `candidates` may be), "
                          f"got {depth}")
    changes = read_journal(bundle)
    if changes.added or changes.retired:
        return _served_system(bundle, stage, depth, source)
    # What the service computes with its default SEQREC_INFERENCE=auto: the compiled encoder, the MLP ranker
    # through ONNX Runtime and LightGBM's trees through lleaves, wherever the service would use them.
    served = ranker_artifact if stage == "two-stage" else None
    encoder, served, _ = compile_stages(bundle, artifact, served, "auto", threads=torch.get_num_threads())
    encode = partial(raw_user_vectors, artifact.model, encoder)
    none = np.zeros(0, dtype=np.int64)
    if stage == "two-stage":
        assert served is not None
        source = FeatureSource(served.tables.torch(), source.item_vectors, served.extras)
        return _System(artifact, served, source, stage, depth, encode, artifact.n_items, none, {})
    return _System(artifact, None, source, stage, depth, encode, artifact.n_items, none, {})


def _served_system(bundle: Path, stage: str, depth: int, source: FeatureSource) -> _System:
    """The system as the service loads it with its catalogue journal: retired items never retrieved (by either
    source), added items with a vector in the index and the ranker's tables, the encoder eager once any is."""
    served = load_served(bundle, inference="auto", threads=torch.get_num_threads())
    artifact, ranker = served.artifact, served.ranker if stage == "two-stage" else None
    encode = served.encode
    banned = np.array(sorted(served.retired), dtype=np.int64)
    assert served.base is not None  # a journal with changes was applied
    catalogue = {"retired": len(banned), "added": artifact.n_items - served.base.n_items,
                 "added_without_vector": len(pending(served))}
    log.info("%s: the catalogue journal applied, as the service serves it: %d items retired, %d added", bundle,
             catalogue["retired"], catalogue["added"])
    if ranker is not None:
        assert served.tables is not None
        source = FeatureSource(served.tables, served.vectors, ranker.extras)
    return _System(artifact, ranker, source, stage, depth, encode, artifact.n_items, banned, catalogue)


def _retrieved(system: _System, data: PreparedDataset, splits: tuple[str, ...],
               split: AnySplit | None = None) -> dict[str, Groups]:
    """Each split's candidates for the history before its target, history excluded (as mined): the
    retriever's top ``depth``, merged with the co-occurrence source's list when the ranker was trained so."""
    split = split or data.split()
    artifact = system.artifact
    encode, sources = system.encode, split_sources(split)
    plans = split_plans(split)
    groups = {}
    for name in splits:
        items, start, end, target = plans[name]
        mined = mine(encode, artifact.index, items, start, end, target,
                     depth=system.depth, max_len=artifact.max_len,
                     exclude_seen=artifact.manifest.exclude_seen, banned=system.banned, desc=f"retrieve {name}")
        timed = system.ranker is not None and system.ranker.needs_time
        if timed and not has_clock(data):
            raise SeqrecError(f"{data.path} has no timestamps; the ranker reads request-time features")
        at, last_event = request_times(split, name, mined) if timed else (None, None)  # as a served request's
        groups[name] = with_served_sources(
            make_groups(mined, sources[name], artifact.max_len, at=at, last_event=last_event),
            sources[name], artifact, system.ranker, system.source.item_vectors, banned=system.banned)
    return groups


def with_served_sources(groups: Groups, items: np.ndarray, artifact: RetrieverArtifact,
                        ranker: RankerArtifact | None, item_vectors: torch.Tensor,
                        banned: np.ndarray | None = None) -> Groups:
    """The retriever's groups merged with the co-occurrence source's list where ``ranker`` was trained on the
    union (as the service merges them); unchanged otherwise. items: the flat array the histories are slices of;
    banned: internal ids never to return (retired items)."""
    if ranker is None or ranker.cooc_share is None:
        return groups
    assert ranker.cooc is not None
    return merge_groups(groups, items, ranker.cooc, ranker.cooc_share, retrieval_rows(artifact.model, item_vectors),
                        exclude_seen=artifact.manifest.exclude_seen, banned=banned)


def _reranked(system: _System, groups: Groups, *, k: int, mask_ids: bool = False) -> Reranked:
    scorer = None if system.ranker is None else system.ranker.ranker.score
    try:
        return rerank_groups(scorer, system.source, groups, system.n_items, k=k, mask_ids=mask_ids)
    except UnrankableScores:
        what = "the retriever" if system.ranker is None else f"the {system.ranker.kind} ranker"
        raise SeqrecError(f"{system.artifact.path}: {what} scores NaN, which cannot be ranked (it diverged in "
                          "training); train it again") from None
