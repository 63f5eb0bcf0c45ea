"""`seqrec mine`, `seqrec train-ranker` and the two-stage `seqrec evaluate`.

Training groups come from training positions only (`ranker.mining.training_groups` on the
split's training sequences); the validation target's group selects the ranker's epoch or
boosting round; the test target's group is scored once, for the report.

Every function takes the split it mines and trains on: leave-one-out's (``data.split()``, the default) or the
temporal protocol's (`offline.data.temporal.TemporalSplit`: training positions before the validation cut, the
validation and test groups the windows' warm users with their next item after the cut). Under the temporal
protocol the ranker's record holds its validation figures only: the test window is read once, by the two-stage
evaluation of the bundle (`offline.jobs.evaluate.evaluate_bundle`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.atomic import atomic_write
from common.errors import SeqrecError
from common.metrics import ndcg_at
from offline.data.prepared import PreparedDataset
from offline.data.temporal import TemporalSplit
from offline.evaluation.evaluate import EVAL_KS, summarize
from offline.evaluation.retriever import check_catalogue
from offline.jobs.holdout import (
    early_stop_positions,
    holdout_folder,
    train_holdout_retriever,
    without_early_stop_targets,
)
from offline.jobs.mine import merge_groups, mine, with_user_vectors
from offline.jobs.splits import AnySplit, split_plans, split_sources
from offline.jobs.tables import extra_tables, item_tables, request_times, with_extras
from ranker.artifact import Ranker, RankerManifest, unit_item_vectors, write_ranker
from ranker.config import HOLDOUT_PER_USER, MAX_DEPTH, MIN_DEPTH, RankerConfig
from ranker.groups import check_names, requiring
from ranker.mining import Mined, training_groups
from ranker.train import (
    FeatureSource,
    Groups,
    RankerDiverged,
    UnrankableScores,
    check_targets,
    config_for,
    fit_lgbm_ranker,
    fit_mlp_ensemble,
    group_ranks,
    make_groups,
)
from retriever.artifact import RetrieverArtifact, load_artifact, retrieval_rows
from retriever.repeats import LEGACY_REPEATS
from service.system.encode import RawEncoder
from service.system.loader import compile_ranker, served_encoder

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
RANKER_NAMES = {"mlp": "MLP", "lgbm": "LightGBM"}  # as messages name them


def mine_splits(artifact: RetrieverArtifact, data: PreparedDataset, config: RankerConfig | None = None, *,
                batch_size: int = 512, holdout: RetrieverArtifact | None = None,
                split: AnySplit | None = None) -> dict[str, Mined]:
    """Groups for train (from ``holdout`` when given: each user's last ``config.holdout_per_user`` training
    targets, less those the holdout retriever early-stopped on), valid, test."""
    config = config or RankerConfig()
    depth = config.depth
    if artifact.index is None:
        raise SeqrecError(f"{artifact.path}: mining needs the artifact's index")
    if depth < MIN_DEPTH:
        raise SeqrecError(f"--depth must be at least {MIN_DEPTH} (the metrics' cut-off), got {depth}")
    if depth > MAX_DEPTH:
        raise SeqrecError(f"--depth must be at most {MAX_DEPTH} (the most a request's `candidates` may be), got "
                          f"{depth}")
    split = split or data.split()
    train_start, train_target_pos = training_groups(split.train.offsets, _per_user(config, holdout))
    if holdout is not None:
        train_start, train_target_pos = without_early_stop_targets(train_start, train_target_pos,
                                                                   early_stop_positions(data, holdout,
                                                                                        config.holdout_per_user, split))
    plans = {"train": (split.train.items, train_start, train_target_pos, split.train.items[train_target_pos]),
             **split_plans(split)}
    if isinstance(split, TemporalSplit):  # the test window is read once, by the bundle's evaluation
        del plans["test"]
    encode = _encoder(artifact)  # each retriever's encoder compiled once
    train_miner, train_encode = (artifact, encode) if holdout is None else (holdout, _encoder(holdout))
    out = {}
    for name, (items, start, end, target) in plans.items():
        miner, miner_encode = (train_miner, train_encode) if name == "train" else (artifact, encode)
        out[name] = mine(miner_encode, miner.index, items, start, end, target, depth=depth,
                         max_len=miner.max_len, batch_size=batch_size,
                         exclude_seen=artifact.manifest.exclude_seen, desc=f"mine {name}")
        log.info("mined %s: %d groups, retriever recall@%d %.4f", name, len(out[name]), depth, out[name].recall())
    return out


def _encoder(artifact: RetrieverArtifact) -> RawEncoder:
    """The artifact's user encoder as the service runs it (`service.system.loader.served_encoder`)."""
    return served_encoder(artifact, threads=torch.get_num_threads())


def _per_user(config: RankerConfig, holdout: RetrieverArtifact | None) -> int:
    """Training targets per user: with holdout mining, exactly the ones the holdout retriever held out."""
    return config.holdout_per_user if holdout is not None else config.per_user


def mining_record(mined: dict[str, Mined], config: RankerConfig, holdout: RetrieverArtifact | None,
                  repeats: str) -> dict[str, Any]:
    """How the groups were mined, as mined.json and the ranker manifest's "mining" record it (``repeats``:
    the retriever manifest's policy they were mined under, recorded, not a second source of truth)."""
    depth = next(iter(mined.values())).depth
    return {"depth": depth, "per_user": _per_user(config, holdout), "repeats": repeats,
            "train_mined_by": "holdout" if holdout is not None else "retriever",
            "holdout_version": None if holdout is None else holdout.manifest.version,
            "holdout_early_stop_users": None if holdout is None else holdout.config.train.eval_users,
            "groups": {n: len(g) for n, g in mined.items()},
            f"recall@{depth}": {n: round(g.recall(), 6) for n, g in mined.items()}}


def save_mined(mined: dict[str, Mined], out: Path, artifact: RetrieverArtifact, config: RankerConfig,
               holdout: RetrieverArtifact | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for name, groups in mined.items():
        atomic_write(out / f"{name}.npz", groups.save)
    info = {"retriever_version": artifact.manifest.version,
            **mining_record(mined, config, holdout, artifact.manifest.repeats)}
    atomic_write(out / "mined.json", lambda p: p.write_text(json.dumps(info, indent=2)))
    return info


def load_mined(folder: Path, artifact: RetrieverArtifact) -> tuple[dict[str, Mined], dict[str, Any],
                                                                   RetrieverArtifact | None]:
    """The mined groups, their info, and the holdout retriever that mined the training groups (if any)."""
    try:
        info = json.loads((folder / "mined.json").read_text())
    except (OSError, ValueError) as err:
        raise SeqrecError(f"{folder}: not a `seqrec mine` output ({err})") from None
    if info.get("retriever_version") != artifact.manifest.version:
        raise SeqrecError(f"{folder} was mined from retriever {info.get('retriever_version')}, not "
                          f"{artifact.manifest.version}; mine again")
    if info.get("repeats", LEGACY_REPEATS) != artifact.manifest.repeats:
        raise SeqrecError(f"{folder} was mined under repeats: {info.get('repeats', LEGACY_REPEATS)}, the bundle "
                          f"follows {artifact.manifest.repeats}; mine again")
    holdout = None
    if info.get("train_mined_by") == "holdout":
        inner = folder / holdout_folder(int(info.get("per_user", HOLDOUT_PER_USER)))
        holdout = load_artifact(inner)
        if holdout.manifest.version != info.get("holdout_version"):
            raise SeqrecError(f"{inner} is not the holdout retriever these groups were mined with")
    # a temporal mining holds no test groups: its test window is read by the bundle's evaluation only
    return ({name: Mined.load(folder / f"{name}.npz") for name in SPLITS
             if name != "test" or (folder / f"{name}.npz").exists()}, info, holdout)


def mine_to(folder: Path, artifact: RetrieverArtifact, data: PreparedDataset, config: RankerConfig,
            split: AnySplit | None = None) -> tuple[dict[str, Mined], dict[str, Any], RetrieverArtifact | None]:
    """Mine into ``folder`` (training the holdout retriever under it first, when the config asks)."""
    miner = None
    if config.holdout:
        miner = train_holdout_retriever(artifact.config, artifact.manifest.repeats, data,
                                        folder / holdout_folder(config.holdout_per_user), config.holdout_per_user,
                                        split)
    mined = mine_splits(artifact, data, config, holdout=miner, split=split)
    return mined, save_mined(mined, folder, artifact, config, miner), miner


def bundle_source(bundle: Path, data: PreparedDataset,
                  split: AnySplit | None = None) -> tuple[RetrieverArtifact, FeatureSource]:
    artifact = load_artifact(bundle)
    check_catalogue(artifact, data)
    return artifact, FeatureSource(item_tables(data, split or data.split()).torch(),
                                   unit_item_vectors(artifact.model.item_vectors().detach()))


def default_mining_dir(bundle: Path) -> Path:
    """BUNDLE.mining beside the bundle, named after the folder a link names: for ARTIFACTS/current, the published
    version's (versions/<version>.mining, deleted with it by the pipeline's pruning). Named after the link,
    the cache of the version `current` left stayed there, and the next version was refused as mined elsewhere."""
    folder = bundle.resolve() if bundle.is_symlink() else bundle
    return folder.parent / f"{folder.name}.mining"


def train_ranker(bundle: Path, data: PreparedDataset, config: RankerConfig | None = None, *,
                 mined_dir: Path | None = None, mlp: dict[str, Any] | None = None,
                 lgbm: dict[str, Any] | None = None, split: AnySplit | None = None) -> RankerManifest:
    """Mine (or reuse ``mined_dir``), fit the ranker, evaluate it, write BUNDLE/ranker/.

    Holdout mining (the default): the training groups come from a retriever that never trained
    on them (`train_holdout_retriever`), kept in ``mined_dir`` (default BUNDLE.mining beside
    the bundle) and reused. Kind "auto" trains both rankers and keeps the one with the
    higher validation NDCG@10; the test split plays no part in the choice (under the temporal protocol the
    ranker's figures are its validation window's only).
    """
    started = time.perf_counter()
    config, split = checked_config(config or RankerConfig()), split or data.split()
    artifact, source = bundle_source(bundle, data, split)
    mined, miner = _mined_groups(bundle, artifact, data, config, mined_dir, split)
    saved = extra_tables(data, config, split)
    groups, source, train_source = _ranker_inputs(artifact, data, mined, miner, config, source, saved, split)
    check_targets(groups, split_sources(split), artifact.manifest.repeats, data.n_items)
    reported = ("valid",) if isinstance(split, TemporalSplit) else ("valid", "test")
    fitted: dict[str, tuple[Ranker, list[dict[str, Any]], float]] = {}
    served: dict[str, Any] = {}
    selection: dict[str, float] = {}
    diverged: dict[str, str] = {}  # kind -> why auto left it out
    for name in ("lgbm", "mlp") if config.kind == "auto" else (config.kind,):
        fit_start = time.perf_counter()
        try:
            ranker, history = _fit(name, artifact, data, source, train_source, groups,
                                   {"members": config.members, **(mlp or {})}, lgbm)
            fit_seconds = time.perf_counter() - fit_start
            served[name] = served_scorer(ranker)
            selection[name] = _selection_ndcg(name, served[name], source, groups["valid"], data.n_items)
        except RankerDiverged as err:  # with auto, the other kind is chosen; the record says why
            if config.kind != "auto":
                raise
            log.warning("%s; --kind auto leaves it out", err)
            diverged[name] = str(err)
            continue
        fitted[name] = (ranker, history, fit_seconds)
    if not fitted:  # auto, and every kind diverged
        raise SeqrecError("; ".join(diverged.values()))
    chosen = max(selection, key=lambda name: selection[name])
    ranker, history, fit_seconds = fitted[chosen]
    metrics = _two_stage_metrics(served[chosen], source, groups, data.n_items, kind=chosen, splits=reported)
    if chosen == "mlp":
        masked = _two_stage_metrics(served[chosen], source, groups, data.n_items, mask_ids=True, kind=chosen,
                                    splits=reported)
        metrics["ids_masked"] = {s: masked[s] for s in reported}
    extra = {
        "mining": mining_record(mined, config, miner, artifact.manifest.repeats),
        "selection": {"requested": config.kind, "chosen": chosen,
                      "valid_ndcg@10": {n: round(v, 6) for n, v in selection.items()},
                      **({"diverged": diverged} if diverged else {})},
        "training": {"seconds": round(fit_seconds, 1), "total_seconds": round(time.perf_counter() - started, 1),
                     "history": history},
        "dataset": {"path": str(data.path), "sha256": data.manifest.get("sha256", {})},
        **sources_record(config, groups),
    }
    return write_ranker(bundle, ranker, item_tables(data, split), retriever_manifest=artifact.manifest,
                        metrics=metrics, extra=extra, saved_tables=saved, extra_features=config.features)


def _selection_ndcg(name: str, scorer: Any, source: FeatureSource, valid: Groups, n_items: int) -> float:
    """Validation NDCG@10 of the served ``scorer``; NaN scores (a diverged ranker, or its compiled form) refused."""
    try:
        return ndcg_at(group_ranks(scorer, source, valid, n_items, desc=f"select {name}"))
    except UnrankableScores:
        raise RankerDiverged(f"the {RANKER_NAMES[name]} ranker diverged (NaN validation scores as served)") from None


def served_scorer(ranker: Ranker) -> Any:
    """``ranker.score`` as the service computes it by default (``SEQREC_INFERENCE=auto``,
    `service.system.loader.compile_ranker`): compiled where it compiles and matches, else eager; so the figures
    written with the ranker are the served ones, not ones a near-tie away from them."""
    from retriever.compiled import ExportRefused

    try:
        return compile_ranker(ranker, None, torch.get_num_threads())[0].score
    except ExportRefused as err:
        log.info("the ranker is scored eagerly, as the service would: %s", err)
        return ranker.score


def checked_config(config: RankerConfig) -> RankerConfig:
    """The config, refused when its sources or extra features are ones this version cannot serve."""
    if "retriever" not in config.sources:
        raise SeqrecError(f"ranker sources {list(config.sources)} must include the retriever")
    try:
        check_names(config.features)
    except ValueError as err:
        raise SeqrecError(str(err)) from None
    return config


def sources_record(config: RankerConfig, groups: dict[str, Groups]) -> dict[str, Any]:
    """The manifest's "sources" (absent for the retriever alone, as older rankers have it) with the union's recall."""
    if not config.cooc_source:
        return {}
    depth = groups["valid"].mined.depth
    return {"sources": {"names": list(config.sources), "cooc_share": config.cooc_share,
                        f"recall@{depth}": {n: round(g.mined.recall(), 6) for n, g in groups.items()}}}


def _mined_groups(bundle: Path, artifact: RetrieverArtifact, data: PreparedDataset, config: RankerConfig,
                  mined_dir: Path | None, split: AnySplit) -> tuple[dict[str, Mined], RetrieverArtifact | None]:
    """The groups of ``mined_dir`` when it holds some (mined the way the config asks), else fresh ones."""
    if config.holdout and mined_dir is None:
        mined_dir = default_mining_dir(bundle)
    if mined_dir is not None and (mined_dir / "mined.json").exists():
        mined, info, miner = load_mined(mined_dir, artifact)
        if config.holdout != (miner is not None):
            raise SeqrecError(f"{mined_dir} was mined {'with' if miner else 'without'} the holdout retriever; "
                              f"choose another --mined folder or --mining {'holdout' if miner else 'direct'}")
        if miner is not None and int(info.get("per_user", HOLDOUT_PER_USER)) != config.holdout_per_user:
            raise SeqrecError(f"{mined_dir} holds out {info.get('per_user', HOLDOUT_PER_USER)} training items per "
                              f"user, not {config.holdout_per_user}; choose another --mined folder")
        if int(info.get("depth", config.depth)) != config.depth:  # a ranker must be trained at the depth asked for
            raise SeqrecError(f"{mined_dir} was mined at depth {info['depth']}, not {config.depth} (--depth); give "
                              f"--depth {info['depth']} to reuse it, or choose another --mined folder")
        if miner is not None:  # folders mined before the early-stopping rule still hold those targets
            train = mined["train"]
            kept, _ = without_early_stop_targets(np.arange(len(train)), train.end,
                                                 early_stop_positions(data, miner, config.holdout_per_user, split))
            if len(kept) < len(train):
                log.warning("%s: left out %d training groups whose target early-stopped the holdout retriever",
                            mined_dir, len(train) - len(kept))
                mined = {**mined, "train": train.subset(kept)}
        return mined, miner
    if mined_dir is not None:
        mined, _, miner = mine_to(mined_dir, artifact, data, config, split)
        return mined, miner
    return mine_splits(artifact, data, config, split=split), None


def _ranker_inputs(artifact: RetrieverArtifact, data: PreparedDataset, mined: dict[str, Mined],
                   miner: RetrieverArtifact | None, config: RankerConfig, source: FeatureSource,
                   saved: dict[str, Any], split: AnySplit) -> tuple[dict[str, Groups], FeatureSource, FeatureSource]:
    """Every split's groups (merged with the co-occurrence source's list when the config asks), the
    feature source of the validation and test groups, and that of the training groups. saved: the tables the
    config's sources and features read (`offline.jobs.tables.extra_tables`), from every training position.

    A training group's features and co-occurrence candidates never count its own target: the
    statistics come from training positions without each user's last per_user (2 with holdout)
    items, and with holdout mining the vectors are those of the model that ranked the group.
    """
    sources = split_sources(split)
    drop = _per_user(config, miner)
    train_saved = extra_tables(data, config, split, drop_last=drop)
    trainer = miner or artifact
    source = with_extras(source, config, saved)
    train_source = with_extras(FeatureSource(item_tables(data, split, drop_last=drop).torch(),
                                             unit_item_vectors(trainer.model.item_vectors().detach())),
                               config, train_saved)
    mined = _with_user_vectors(mined, sources, artifact, trainer)
    groups = {}
    for name in [*(n for n in mined if n != "train"), "train"]:  # the order the manifest's records list them in
        timed = bool(requiring(config.features, "timestamps"))
        at, last_event = request_times(split, name, mined[name]) if timed else (None, None)
        max_len = trainer.max_len if name == "train" else artifact.max_len
        groups[name] = make_groups(mined[name], sources[name], max_len, at=at, last_event=last_event)
    if config.cooc_source:
        rows = retrieval_rows(artifact.model, source.item_vectors)
        train_rows = rows if trainer is artifact else retrieval_rows(trainer.model, train_source.item_vectors)
        for name, g in groups.items():
            table, item_rows = (train_saved["cooc"], train_rows) if name == "train" else (saved["cooc"], rows)
            groups[name] = merge_groups(g, sources[name], table, config.cooc_share, item_rows,
                                        exclude_seen=artifact.manifest.exclude_seen)
    return groups, source, train_source


def _with_user_vectors(mined: dict[str, Mined], sources: dict[str, np.ndarray], artifact: RetrieverArtifact,
                       trainer: RetrieverArtifact) -> dict[str, Mined]:
    """The groups with the user vectors they were mined with: groups loaded from disk (`load_mined`) get them again
    from the retriever that mined them (``trainer`` for the training groups)."""
    encoders: dict[Path, RawEncoder] = {}
    out = {}
    for name, groups in mined.items():
        miner = trainer if name == "train" else artifact
        if groups.user is None:
            if miner.path not in encoders:  # each retriever's encoder compiled once
                encoders[miner.path] = _encoder(miner)
            groups = with_user_vectors(groups, encoders[miner.path], sources[name], miner.max_len)
        out[name] = groups
    return out


def _fit(name: str, artifact: RetrieverArtifact, data: PreparedDataset, source: FeatureSource,
         train_source: FeatureSource, groups: dict[str, Groups], mlp: dict[str, Any] | None,
         lgbm: dict[str, Any] | None) -> tuple[Ranker, list[dict[str, Any]]]:
    if name == "mlp":
        config = config_for(source, artifact.manifest.dim, data.n_items, **(mlp or {}))
        return fit_mlp_ensemble(config, source, groups["train"], groups["valid"], train_source=train_source)
    return fit_lgbm_ranker(source, groups["train"], groups["valid"], params=lgbm, train_source=train_source)


def _two_stage_metrics(scorer: Any, source: FeatureSource, groups: dict[str, Groups], n_items: int, *,
                       kind: str, mask_ids: bool = False, ks: tuple[int, ...] = EVAL_KS,
                       splits: tuple[str, ...] = ("valid", "test")) -> dict[str, Any]:
    depth = groups["valid"].mined.depth
    usable = tuple(k for k in ks if k <= depth)
    out: dict[str, Any] = {}
    for name in splits:
        try:
            ranks = group_ranks(scorer, source, groups[name], n_items, mask_ids=mask_ids, desc=f"rerank {name}")
        except UnrankableScores:
            raise RankerDiverged(f"the {RANKER_NAMES[kind]} ranker diverged (NaN scores for the {name} users"
                                 f"{' with their IDs masked' if mask_ids else ''}); nothing was written") from None
        out[name] = summarize(ranks, usable)
    return out
