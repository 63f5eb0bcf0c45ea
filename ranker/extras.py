"""Optional ranker features beyond `ranker.features.DENSE_FEATURES`: from the co-occurrence table, for
data with timestamps as of the request's time, and from the catalogue's metadata near the history's end.

A ranker is trained on the base columns plus the extras its config names (kept when validation
says so); the manifest records the list, so a ranker without extras (every older bundle) still
loads and is served the base columns alone. Each column is one array operation over all
candidates of the batch, from training positions only (`ranker.cooc.CoocTable`, `ranker.times.TimeTable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ranker.cooc import TorchCooc
from ranker.times import TimeTable

COOC_FEATURES = (
    "cooc_last1",  # P(candidate follows the newest history item)
    "cooc_last3",  # recency-weighted sum over the newest 3 (weights decay ** j)
    "cooc_last10",  # ... over the newest 10: the co-occurrence source's own score
    "cooc_rank",  # log1p(candidates with a higher cooc_last10), -1 when it is 0 (not a cooc candidate)
    "popularity_trend",  # log share among users' last training items over share among all training items
)
TIME_FEATURES = (  # as of the request's time `at` (`ranker.times`); need timestamps
    "recent_30d",  # log1p(the candidate's training interactions in the 30 days before `at`)
    "recent_7d",  # ... in the 7 days before `at`
    "days_since_last",  # log1p(days from its last training interaction before `at`), -1 when none
    "days_since_first",  # log1p(days from its first training interaction before `at`), -1 when none
    "user_idle_days",  # log1p(days from the user's newest interaction to `at`), -1 when its time is unknown
)
META_FEATURES = (  # from the catalogue's metadata (genres, attributes), computed with the base columns
    "meta_last",  # share of the candidate's metadata values that the newest history item has
    "meta_recent",  # ... that any of the newest META_RECENT history items has
)
META_RECENT = 3
EXTRA_FEATURES = COOC_FEATURES + TIME_FEATURES + META_FEATURES
COOC_WINDOWS = {"cooc_last1": 1, "cooc_last3": 3, "cooc_last10": 10}
NOT_FOUND = -1.0  # the sentinel of a rank feature when the source does not hold the candidate


@dataclass(frozen=True)
class Extras:
    """The extra columns a ranker reads, in order, and the table they come from."""

    names: tuple[str, ...]
    cooc: TorchCooc | None = None  # needed by COOC_FEATURES
    times: TimeTable | None = None  # needed by TIME_FEATURES

    @property
    def needs_time(self) -> bool:
        return needs_time(self.names)


def check_names(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in EXTRA_FEATURES]
    if unknown:
        raise ValueError(f"unknown ranker features {unknown}; choose from {', '.join(EXTRA_FEATURES)}")
    return tuple(names)


def needs_cooc(names: tuple[str, ...] | list[str]) -> bool:
    return any(n in COOC_FEATURES for n in names)


def needs_time(names: tuple[str, ...] | list[str]) -> bool:
    return any(n in TIME_FEATURES for n in names)


def needs_meta(names: tuple[str, ...] | list[str]) -> bool:
    return any(n in META_FEATURES for n in names)


def extra_columns(extras: Extras, history: Tensor, candidates: Tensor, unknown: Tensor,
                  at: Tensor | None = None, last_event: Tensor | None = None,
                  given: dict[str, Tensor] | None = None) -> Tensor:
    """(B, N, len(extras.names)) float32 for (B, T) left-padded histories and (B, N) candidates.

    given: the META_FEATURES columns, which `ranker.features.compute_features` computes from the base tables.

    at: (B,) each request's time in seconds, needed by TIME_FEATURES; last_event: (B,) the time of each
    user's newest interaction, NaN where unknown (needed by user_idle_days). Every column is computed in
    float64 and rounded once, so a user's value does not depend on the batch (offline groups and served
    micro-batches agree bit for bit). The co-occurrence columns are 0 (the rank: NOT_FOUND) for an unknown
    candidate, as the ID-derived base columns are; the time columns, like popularity, are not masked.
    """
    b, n = candidates.shape
    if not extras.names:
        return torch.zeros(b, n, 0)
    columns: dict[str, Tensor] = dict(given or {})
    if needs_meta(extras.names) and not all(n in columns for n in extras.names if n in META_FEATURES):
        raise ValueError("the metadata features are computed with the base columns (`compute_features`)")
    if extras.needs_time:
        if extras.times is None or at is None:
            raise ValueError(f"ranker features {[x for x in extras.names if x in TIME_FEATURES]} need the "
                             "training interactions' times and each request's time")
        timed = extras.times.columns(candidates.numpy(), at.numpy(), None if last_event is None else last_event.numpy())
        columns.update({name: torch.from_numpy(value) for name, value in timed.items()})
    if not needs_cooc(extras.names):
        return torch.stack([columns[name].float() for name in extras.names], dim=-1)
    assert extras.cooc is not None, "co-occurrence features need the co-occurrence table"
    width = max(COOC_WINDOWS.values())
    recent = torch.zeros(b, width, dtype=history.dtype)
    take = min(width, history.shape[1])
    recent[:, width - take:] = history[:, history.shape[1] - take:]
    weight = extras.cooc.follows(recent[:, None, :].expand(b, n, width), candidates[:, :, None].expand(b, n, width))
    decay = extras.cooc.decay ** torch.arange(width - 1, -1, -1, dtype=torch.float64)  # newest weighs 1
    weighted = weight * decay  # (B, N, W)
    columns.update({name: weighted[..., -size:].sum(-1) for name, size in COOC_WINDOWS.items()})
    source = columns["cooc_last10"].float().masked_fill(unknown, 0.0)
    higher = (source[:, None, :] > source[:, :, None]).sum(-1)  # (B, N) candidates scoring above
    columns["cooc_rank"] = torch.where(source > 0, torch.log1p(higher.float()), torch.full_like(source, NOT_FOUND))
    trend = extras.cooc.trend
    inside = candidates < len(trend)  # items added after training have no trend
    columns["popularity_trend"] = torch.where(inside, trend[torch.where(inside, candidates, 0)], 0.0)
    out = torch.stack([columns[name].float() for name in extras.names], dim=-1)
    cooc_cols = [i for i, name in enumerate(extras.names) if name in COOC_WINDOWS]
    out[..., cooc_cols] = out[..., cooc_cols].masked_fill(unknown[..., None], 0.0)
    return out
