"""Next-item losses over every trained position of every sequence.

Each loss takes the positions that have a real input and a real target (padding already
masked out by the caller): ``hidden`` (P, D) user states projected for scoring,
``targets`` (P,) internal item ids, and the encoder's raw ``(n_items + 1, D)`` item table
with the projection to apply to the rows it uses (so in-batch and sampled losses never
normalise a million-row table).

- ``infonce``: softmax over the distinct targets of the batch (in-batch negatives, as the
  retriever-and-ranker reference trains).
  Duplicates are merged, so an item equal to the positive is never a negative and an item
  that is the target of many positions counts once in the denominator. Optional logQ
  correction (subtract the log of each candidate's chance of being in the set) and extra
  uniform negatives mixed in: plain in-batch negatives under-sample the tail and can
  collapse on long-tail data such as Amazon Beauty.
- ``sampled``: softmax over the positive and N uniform negatives shared by the batch.
- ``full``: cross-entropy over all items (SASRec+ / "CE" of Klenitskiy & Vasilev 2023).
- ``bce``: the original SASRec objective, one uniform negative per position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from common.errors import RetrieverError

LossName = Literal["infonce", "sampled", "full", "bce"]
LOSSES: tuple[LossName, ...] = ("infonce", "sampled", "full", "bce")
Project = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class LossContext:
    """What the losses need besides the batch.

    item_log_prob: (n_items + 1,) log frequency of each item over training targets (logQ).
    """

    temperature: float
    project: Project
    item_log_prob: Tensor | None = None
    generator: torch.Generator | None = None


def infonce(
    hidden: Tensor, targets: Tensor, items: Tensor, ctx: LossContext, *, logq: bool = False, n_uniform: int = 0
) -> Tensor:
    candidates, labels = torch.unique(targets, return_inverse=True)  # (U,), (P,)
    hidden = hidden / ctx.temperature
    logits = hidden @ ctx.project(items[candidates]).T  # (P, U)
    if logq or n_uniform:
        n_items = items.shape[0] - 1
        uniform_rate = n_uniform / n_items
        if logq:
            logits = logits - _log_expected_count(candidates, len(targets), uniform_rate, ctx)
        if n_uniform:
            negatives = _uniform(n_uniform, n_items, targets.device, ctx.generator)  # (M,)
            extra = hidden @ ctx.project(items[negatives]).T  # (P, M)
            if logq:
                extra = extra - _log_expected_count(negatives, len(targets), uniform_rate, ctx)
            extra = extra.masked_fill(negatives[None, :] == targets[:, None], -torch.inf)
            logits = torch.cat([logits, extra], dim=1)
    return F.cross_entropy(logits, labels)


def sampled_softmax(hidden: Tensor, targets: Tensor, items: Tensor, ctx: LossContext, *, n_negatives: int) -> Tensor:
    negatives = _uniform(n_negatives, items.shape[0] - 1, targets.device, ctx.generator)  # (N,)
    positive = (hidden * ctx.project(items[targets])).sum(-1, keepdim=True)  # (P, 1)
    negative = hidden @ ctx.project(items[negatives]).T  # (P, N)
    negative = negative.masked_fill(negatives[None, :] == targets[:, None], -torch.inf)
    logits = torch.cat([positive, negative], dim=1) / ctx.temperature
    return F.cross_entropy(logits, torch.zeros(len(targets), dtype=torch.long, device=targets.device))


def full_softmax(hidden: Tensor, targets: Tensor, items: Tensor, ctx: LossContext) -> Tensor:
    # Scaling the (P, D) side instead of the (P, n_items) logits saves a full pass forward and backward.
    logits = (hidden / ctx.temperature) @ ctx.project(items[1:]).T  # (P, n_items); padding is not a class
    return F.cross_entropy(logits, targets - 1)


def bce(hidden: Tensor, targets: Tensor, items: Tensor, ctx: LossContext) -> Tensor:
    negatives = _uniform_per_row(targets, items.shape[0] - 1, ctx.generator)  # (P,), never the positive
    positive = (hidden * ctx.project(items[targets])).sum(-1) / ctx.temperature
    negative = (hidden * ctx.project(items[negatives])).sum(-1) / ctx.temperature
    return F.binary_cross_entropy_with_logits(
        torch.cat([positive, negative]), torch.cat([torch.ones_like(positive), torch.zeros_like(negative)])
    )


def compute_loss(
    name: LossName,
    hidden: Tensor,
    targets: Tensor,
    items: Tensor,
    ctx: LossContext,
    *,
    logq: bool = False,
    n_uniform: int = 0,
    n_negatives: int = 256,
) -> Tensor:
    """Dispatch by name; hidden (P, D), targets (P,) in [1, n_items], items (n_items + 1, D)."""
    if name == "infonce":
        return infonce(hidden, targets, items, ctx, logq=logq, n_uniform=n_uniform)
    if name == "sampled":
        return sampled_softmax(hidden, targets, items, ctx, n_negatives=n_negatives)
    if name == "full":
        return full_softmax(hidden, targets, items, ctx)
    if name == "bce":
        return bce(hidden, targets, items, ctx)
    raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")


def item_log_prob(train_targets: Tensor, n_items: int) -> Tensor:
    """(n_items + 1,) log of each item's share of training targets (add-one smoothed)."""
    counts = torch.bincount(train_targets, minlength=n_items + 1).double() + 1.0
    counts[0] = 0.0
    return (counts / counts.sum()).log().float()


def _log_expected_count(candidates: Tensor, n_positions: int, uniform_rate: float, ctx: LossContext) -> Tensor:
    """log of how often each candidate is expected among the negatives: its chance of being one
    of the batch's n_positions targets, plus the uniform sampler's rate."""
    if ctx.item_log_prob is None:
        raise ValueError("logQ correction needs item_log_prob in the loss context")
    p = ctx.item_log_prob[candidates].double().exp()
    in_batch = -torch.expm1(n_positions * torch.log1p(-p))  # 1 - (1 - p)^P without cancellation
    return (in_batch + uniform_rate).log().float()


def _uniform(n: int, n_items: int, device: torch.device, generator: torch.Generator | None) -> Tensor:
    return torch.randint(1, n_items + 1, (n,), device=device, generator=generator)


BCE_NEEDS = ("loss bce draws each position's negative from the items other than its target: it needs a catalogue "
             "of at least 2 items, this one has {n_items}")


def _uniform_per_row(targets: Tensor, n_items: int, generator: torch.Generator | None) -> Tensor:
    if n_items < 2:  # no item but the positive to draw
        raise RetrieverError(BCE_NEEDS.format(n_items=n_items))
    # Draw from n_items - 1 ids and skip over the positive: uniform over the others, no rejection loop.
    draw = torch.randint(1, n_items, targets.shape, device=targets.device, generator=generator)
    return draw + (draw >= targets).long()
