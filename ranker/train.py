"""Training and evaluating rankers on mined groups.

``Groups`` are mined candidate lists with their histories and user vectors computed
once; features are computed per batch by `ranker.features.compute_features`, the same
function the service calls, so offline and online inputs cannot drift apart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from common.errors import SeqrecError
from common.metrics import ndcg_at
from ranker.config import MLPConfig
from ranker.features import FeatureBatch, compute_features, standardize_stats
from ranker.groups import Extras
from ranker.lgbm import LGBMRanker, fit_lgbm
from ranker.mining import Mined
from ranker.mlp import MLPRanker, group_loss
from ranker.tables import TorchTables
from retriever.windows import padded_slices

log = logging.getLogger(__name__)

Scorer = Callable[[FeatureBatch], Tensor]  # (B, N) scores, -inf on empty slots


class UnrankableScores(ValueError):
    """Scores holding NaN: a NaN is neither above, below nor equal to any score, so no order ranks it (counted
    as ties it would rank every target first, an NDCG of 1/log2(1) = inf)."""


class RankerDiverged(SeqrecError):
    """A ranker whose training diverged: its loss became NaN or infinite, or its scores NaN."""


@dataclass(frozen=True)
class FeatureSource:
    """What features need beside the groups: item tables and unit retriever item vectors."""

    tables: TorchTables
    item_vectors: Tensor  # (n_items + 1, D), row 0 = 0
    extras: Extras | None = None  # the extra columns the ranker reads (`ranker.groups`)

    @property
    def extra_features(self) -> tuple[str, ...]:
        return () if self.extras is None else self.extras.names


@dataclass(frozen=True)
class Groups:
    mined: Mined
    history: np.ndarray  # (G, T) left-padded, the last max_len items the user vector saw
    user: Tensor  # (G, D) unit user vectors
    at: np.ndarray | None = None  # (G,) each group's request time in seconds (its target's); None: no times
    last_event: np.ndarray | None = None  # (G,) the time of the newest history item (with ``at``)

    def __len__(self) -> int:
        return len(self.mined)

    def subset(self, rows: np.ndarray) -> Groups:
        return Groups(self.mined.subset(rows), self.history[rows], self.user[torch.from_numpy(rows)],
                      None if self.at is None else self.at[rows],
                      None if self.last_event is None else self.last_event[rows])


def make_groups(mined: Mined, items: np.ndarray, max_len: int, *, at: np.ndarray | None = None,
                last_event: np.ndarray | None = None) -> Groups:
    """Groups of ``mined``, whose user vectors are the ones it was searched with (``mined.user``), over histories
    items[start:end] left-padded to ``max_len`` (the window the vectors saw)."""
    if mined.user is None:
        raise ValueError("the mined groups carry no user vectors (`offline.jobs.mine.with_user_vectors`)")
    return Groups(mined, padded_slices(items, mined.start, mined.end, max_len), mined.user, at, last_event)


def group_inputs(groups: Groups, rows: np.ndarray) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None,
                                                              Tensor | None]:
    """The rerank's inputs for ``rows`` of the groups: (b, T') histories (their common left padding trimmed), (b, D)
    user vectors, (b, N) candidates and their retrieval scores, and the request and newest-event times (or None)."""
    history = groups.history[rows]
    width = max(int((history != 0).sum(1).max()), 1) if len(rows) else 1
    return (torch.from_numpy(history[:, -width:]), groups.user[torch.from_numpy(rows)],
            torch.from_numpy(groups.mined.candidates[rows]), torch.from_numpy(groups.mined.scores[rows]),
            None if groups.at is None else torch.from_numpy(groups.at[rows]),
            None if groups.last_event is None else torch.from_numpy(groups.last_event[rows]))


def features(source: FeatureSource, groups: Groups, rows: np.ndarray, id_mask: Tensor | None = None) -> FeatureBatch:
    history, user, candidates, scores, at, last_event = group_inputs(groups, rows)
    return compute_features(source.tables, source.item_vectors, history, user, candidates, scores, id_mask=id_mask,
                            extras=source.extras, at=at, last_event=last_event)


def group_ranks(scorer: Scorer, source: FeatureSource, groups: Groups, n_items: int, *, mask_ids: bool = False,
                batch_size: int = 512, desc: str = "rerank") -> np.ndarray:
    """(G,) full-ranking rank of each target after reranking its candidates.

    Pessimistic ties; a target the retriever did not return gets n_items + 1 (a miss at
    every cut-off up to N). mask_ids scores every candidate as unknown (cold start).
    """
    label = groups.mined.label
    ranks = np.full(len(groups), n_items + 1, dtype=np.int64)
    with torch.inference_mode():
        for lo in tqdm(range(0, len(groups), batch_size), desc=desc, unit="batch", disable=None, leave=False):
            rows = np.arange(lo, min(lo + batch_size, len(groups)))
            hit = rows[label[rows] >= 0]
            if len(hit) == 0:
                continue
            mask = torch.ones(groups.mined.candidates[hit].shape, dtype=torch.bool) if mask_ids else None
            scores = scorer(features(source, groups, hit, mask))  # (b, N)
            retrieval = torch.from_numpy(groups.mined.scores[hit]).double()
            ranks[hit] = served_order_ranks(scores.double(), retrieval, torch.from_numpy(label[hit]))
    return ranks


def served_order_ranks(scores: Tensor, retrieval: Tensor, target: Tensor) -> np.ndarray:
    """(b,) pessimistic rank of each target under the served order: by score, ties by retrieval score.

    The service sorts the ranker's scores with ties kept in retrieval order (a stable sort of candidates that
    arrive best-retrieved first), so the system's score is the pair (score, retrieval score). A LightGBM ranker
    gives many candidates the same score; counting those ties against the target alone would measure an order
    that nobody serves. Only candidates equal on both count as ties, pessimistically (the target itself
    included: rank >= 1).
    """
    if len(scores) and torch.isnan(scores.amax()):  # amax propagates NaN, cheaper than isnan().any()
        raise UnrankableScores("scores contain NaN; a NaN cannot be ranked")
    rows = torch.arange(len(target))
    s, r = scores[rows, target][:, None], retrieval[rows, target][:, None]
    return ((scores > s) | ((scores == s) & (retrieval >= r))).sum(1).numpy()


def retriever_ranks(groups: Groups, n_items: int) -> np.ndarray:
    """(G,) the retriever's own ranks from the mined candidate scores (ties pessimistic)."""
    label = groups.mined.label
    scores = torch.from_numpy(groups.mined.scores).masked_fill(torch.from_numpy(groups.mined.candidates == 0),
                                                               -torch.inf)
    hit = label >= 0
    target = scores[torch.arange(len(label)), torch.from_numpy(np.maximum(label, 0))]
    ranks = (scores >= target[:, None]).sum(1).numpy()
    return np.where(hit, ranks, n_items + 1)


def id_drop(shape: tuple[int, ...], p: float, generator: torch.Generator) -> Tensor | None:
    """A (B, N) mask of the candidates ID dropout marks unknown (probability p); None when p is 0."""
    return torch.rand(shape, generator=generator) < p if p > 0 else None


def fit_mlp(config: MLPConfig, source: FeatureSource, train: Groups, valid: Groups, *,
            train_source: FeatureSource | None = None, progress: bool = True) -> tuple[MLPRanker, list[dict[str, Any]]]:
    """Train on groups that hold their positive; early stopping on validation NDCG@10 (two-stage).

    train_source: item vectors of the retriever that mined the training groups, when that is
    not the served one (holdout mining); features must come from the model that ranked them.
    """
    if config.members != 1:
        raise ValueError("fit_mlp trains one network; an ensemble is fit_mlp_ensemble's")
    valid_source, source = source, train_source or source
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    train = train.subset(np.flatnonzero(train.mined.label >= 0))
    if len(train) == 0:  # `check_targets` names the cause where the groups are mined
        raise SeqrecError("no ranker training group holds its target among its candidates")
    model = MLPRanker(config)
    # Input scaling from the inputs the network trains on: ID dropout included, so an ID-masked candidate's
    # zeroed columns and its is_unknown flag are part of the statistics.
    sample = np.sort(np.random.default_rng(config.seed).permutation(len(train))[:4096])
    shape = train.mined.candidates[sample].shape
    scaling_drop = id_drop(shape, config.id_dropout, torch.Generator().manual_seed(config.seed))
    batch = features(source, train, sample, scaling_drop)
    model.set_scaling(*standardize_stats(batch.dense, batch.valid))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    labels = torch.from_numpy(train.mined.label)
    n_items = config.n_items
    best, best_state, best_epoch, history = -math.inf, None, 0, []
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = torch.randperm(len(train), generator=generator).numpy()
        total, steps = 0.0, 0
        for lo in tqdm(range(0, len(order), config.batch_size), desc=f"ranker epoch {epoch}", unit="batch",
                       disable=None if progress else True, leave=False):
            rows = np.sort(order[lo : lo + config.batch_size])
            shape = train.mined.candidates[rows].shape
            drop = id_drop(shape, config.id_dropout, generator)
            batch = features(source, train, rows, drop)
            logits = model(batch)
            loss = group_loss(logits, labels[rows], batch.valid, config.loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
        if not math.isfinite(total):
            raise _diverged(config, f"training loss {total / max(steps, 1)} at epoch {epoch}")
        try:
            metric = ndcg_at(group_ranks(model.score, valid_source, valid, n_items, desc="ranker valid"))
        except UnrankableScores:
            raise _diverged(config, f"NaN validation scores at epoch {epoch}") from None
        history.append({"epoch": epoch, "loss": total / max(steps, 1), "valid_ndcg@10": metric})
        log.info("ranker epoch %d loss %.4f valid NDCG@10 %.4f", epoch, total / max(steps, 1), metric)
        if metric > best:
            best, best_epoch = metric, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        elif epoch - best_epoch >= config.patience:
            break
    assert best_state is not None
    model.load_state_dict(best_state)
    return model.eval(), history


def _diverged(config: MLPConfig, what: str) -> RankerDiverged:
    return RankerDiverged(f"the MLP ranker diverged ({what}); lower --lr (now {config.lr:g})")


def fit_mlp_ensemble(config: MLPConfig, source: FeatureSource, train: Groups, valid: Groups, *,
                     train_source: FeatureSource | None = None,
                     progress: bool = True) -> tuple[MLPRanker, list[dict[str, Any]]]:
    """``config.members`` MLPs, each trained alone by `fit_mlp` from seed ``config.seed + i`` (its own
    early stopping), scored together by their mean logit (`MLPRanker.ensemble`). One member: `fit_mlp`.

    The history lists every member's epochs (with a "member" key when there are several).
    """
    if config.members < 1:
        raise ValueError(f"an MLP ranker needs at least one member, got {config.members}")
    if config.members == 1:
        return fit_mlp(config, source, train, valid, train_source=train_source, progress=progress)
    members, history = [], []
    for i in range(config.members):
        log.info("MLP ranker member %d of %d", i + 1, config.members)
        model, steps = fit_mlp(replace(config, members=1, seed=config.seed + i), source, train, valid,
                               train_source=train_source, progress=progress)
        members.append(model)
        history += [{"member": i, **step} for step in steps]
    return MLPRanker.ensemble(members), history


def lgbm_matrix(source: FeatureSource, groups: Groups, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray,
                                                                                         np.ndarray]:
    """Rows of groups that hold their positive: (x (rows, F), y (rows,), group sizes)."""
    keep = np.flatnonzero(groups.mined.label >= 0)
    if len(keep) == 0:  # LightGBM cannot fit or validate without one; `check_targets` says why
        raise SeqrecError("no LightGBM ranker group holds its target among its candidates")
    xs, ys, sizes = [], [], []
    label = groups.mined.label
    with torch.inference_mode():
        for lo in range(0, len(keep), batch_size):
            rows = keep[lo : lo + batch_size]
            batch = features(source, groups, rows)
            valid = batch.valid.numpy()
            y = np.zeros(valid.shape, dtype=np.float32)
            y[np.arange(len(rows)), label[rows]] = 1.0
            xs.append(batch.dense.numpy()[valid])
            ys.append(y[valid])
            sizes.append(valid.sum(1))
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys), np.concatenate(sizes)


def fit_lgbm_ranker(source: FeatureSource, train: Groups, valid: Groups, *, params: dict[str, Any] | None = None,
                    rounds: int = 1000, patience: int = 50,
                    train_source: FeatureSource | None = None) -> tuple[LGBMRanker, list[dict[str, Any]]]:
    tx, ty, tg = lgbm_matrix(train_source or source, train)
    vx, vy, vg = lgbm_matrix(source, valid)
    log.info("LightGBM on %d training groups (%d rows), %d validation groups", len(tg), len(tx), len(vg))
    return fit_lgbm(tx, ty, tg, vx, vy, vg, params=params, rounds=rounds, patience=patience,
                    extra_features=source.extra_features)


def config_for(source: FeatureSource, dim: int, n_items: int, **overrides: Any) -> MLPConfig:
    tables = source.tables
    base = MLPConfig(n_items=n_items, n_meta=tables.n_meta, n_year_buckets=int(tables.year_bucket.max()), dim=dim,
                     extra_features=source.extra_features)
    return replace(base, **overrides)


def check_targets(groups: dict[str, Groups], sources: dict[str, np.ndarray], repeats: str, n_items: int) -> None:
    """Refuse, naming the cause, training or validation groups none of which holds its target among its candidates
    (a ranker learns from those groups only, and is validated on those): the target repeats a history item that the
    bundle's repeats policy keeps out of the candidates, or the retriever did not return it at this depth."""
    for name, role in (("train", "training"), ("valid", "validation")):
        mined = groups[name].mined
        if (mined.label >= 0).any():
            continue
        depth, n = mined.depth, len(mined)
        if n == 0:
            raise SeqrecError(f"the data gives no ranker {role} group (no user has a target after a history)")
        items = sources[name]
        seen = sum(int(t in items[s:e]) for s, e, t in zip(mined.start, mined.end, mined.target, strict=True))
        stem = f"none of the {n} ranker {role} groups holds its target among its candidates"
        excluded = "which the bundle's repeats: exclude keeps out of the candidates"
        if repeats == "exclude" and seen == n:
            raise SeqrecError(f"{stem}: every target repeats an item of its user's history, {excluded}; a ranker "
                              "has nothing to learn (a retriever trained with train.repeats allow ranks repeats)")
        deeper = f"raise --depth (now {depth})" if depth < n_items else f"--depth {depth} already covers the catalogue"
        if repeats == "exclude" and seen:
            deeper += f"; {seen} of the targets repeat an item of their user's history, {excluded}"
        raise SeqrecError(f"{stem}: the retriever returned none of them; {deeper}")
