"""Optional ranker features beyond `ranker.features.DENSE_FEATURES`, from the co-occurrence table.

A ranker is trained on the base columns plus the extras its config names (kept when validation
says so); the manifest records the list, so a ranker without extras (every older bundle) still
loads and is served the base columns alone. Each column is one array operation over all
candidates of the batch, from training positions only (`ranker.cooc.CoocTable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ranker.cooc import TorchCooc

EXTRA_FEATURES = (
    "cooc_last1",  # P(candidate follows the newest history item)
    "cooc_last3",  # recency-weighted sum over the newest 3 (weights decay ** j)
    "cooc_last10",  # ... over the newest 10: the co-occurrence source's own score
    "cooc_rank",  # log1p(candidates with a higher cooc_last10), -1 when it is 0 (not a cooc candidate)
    "popularity_trend",  # log share among users' last training items over share among all training items
)
COOC_WINDOWS = {"cooc_last1": 1, "cooc_last3": 3, "cooc_last10": 10}
NOT_FOUND = -1.0  # the sentinel of a rank feature when the source does not hold the candidate


@dataclass(frozen=True)
class Extras:
    """The extra columns a ranker reads, in order, and the table they come from."""

    names: tuple[str, ...]
    cooc: TorchCooc


def check_names(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in EXTRA_FEATURES]
    if unknown:
        raise ValueError(f"unknown ranker features {unknown}; choose from {', '.join(EXTRA_FEATURES)}")
    return tuple(names)


def extra_columns(extras: Extras, history: Tensor, candidates: Tensor, unknown: Tensor) -> Tensor:
    """(B, N, len(extras.names)) float32 for (B, T) left-padded histories and (B, N) candidates.

    The co-occurrence columns are computed in float64 and rounded once, so a user's value does not
    depend on the batch (offline groups and served micro-batches agree bit for bit); they are 0
    (the rank: NOT_FOUND) for an unknown candidate, as the ID-derived base columns are.
    """
    b, n = candidates.shape
    if not extras.names:
        return torch.zeros(b, n, 0)
    width = max(COOC_WINDOWS.values())
    recent = torch.zeros(b, width, dtype=history.dtype)
    take = min(width, history.shape[1])
    recent[:, width - take:] = history[:, history.shape[1] - take:]
    weight = extras.cooc.follows(recent[:, None, :].expand(b, n, width), candidates[:, :, None].expand(b, n, width))
    decay = extras.cooc.decay ** torch.arange(width - 1, -1, -1, dtype=torch.float64)  # newest weighs 1
    weighted = weight * decay  # (B, N, W)
    columns: dict[str, Tensor] = {name: weighted[..., -size:].sum(-1) for name, size in COOC_WINDOWS.items()}
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
