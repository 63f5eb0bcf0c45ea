"""Request-time item features: how recently, and how often lately, each candidate was interacted with.

A ranker that reads these columns (`ranker.groups.request_time`) scores a request as of a time ``at``
(unix seconds): offline, the timestamp of the target the group predicts; served, the request's ``at``, or the
server's clock when a request gives none. The counts come from training positions only, and only those
before ``at`` count, so a group never sees an interaction from its own future. The table is every training
interaction's (item, timestamp), sorted, saved as ``BUNDLE/ranker/times.npz`` (numpy arrays, loaded
with ``allow_pickle=False``); one lookup is a binary search per candidate.

Timestamps are read as seconds (the windows are 7 and 30 days); a dataset without timestamps cannot
train a ranker with these features.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

TIMES_FILE = "times.npz"
DAY = 86_400
WINDOWS = {"recent_30d": 30 * DAY, "recent_7d": 7 * DAY}  # log1p(interactions in [at - window, at))
NONE = -1.0  # days_since_* when the item has no training interaction before ``at``; user_idle_days unknown
MAX_SECONDS = 1e11  # year 5138, as POST /events takes; unix milliseconds of any date after 1973 are above it
_SHIFT = 40  # key = item << 40 | time: room for timestamps up to 2**40 s (> MAX_SECONDS) and 2**23 items


@dataclass(frozen=True)
class TimeTable:
    """items / times: every training interaction, sorted by (item, time); first[i]: item i's first row."""

    items: np.ndarray  # (n,) int64
    times: np.ndarray  # (n,) int64 seconds
    first: np.ndarray  # (n_items + 2,) int64

    @cached_property
    def keys(self) -> np.ndarray:
        """(n,) item << _SHIFT | time, sorted: one binary search finds an (item, time) pair."""
        return (self.items << _SHIFT) | self.times

    @classmethod
    def build(cls, items: np.ndarray, times: np.ndarray, n_items: int) -> TimeTable:
        times = np.asarray(times)
        if len(times) and (not np.all(np.isfinite(times)) or times.min() < 0 or times.max() > MAX_SECONDS):
            raise ValueError(f"request-time features need timestamps in unix seconds, 0 to {MAX_SECONDS:.0e} (year "
                             f"5138; milliseconds are larger); found {times.min():.4g} to {times.max():.4g}")
        times = np.floor(times).astype(np.int64)
        order = np.lexsort((times, items))
        items = np.asarray(items, dtype=np.int64)[order]
        return cls(items, times[order], np.searchsorted(items, np.arange(n_items + 2), "left").astype(np.int64))

    @property
    def n_items(self) -> int:
        return len(self.first) - 2

    def save(self, path: Path) -> None:
        with path.open("wb") as handle:
            np.savez(handle, items=self.items, times=self.times, first=self.first)

    @classmethod
    def load(cls, path: Path) -> TimeTable:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["items"], z["times"], z["first"])

    def columns(self, candidates: np.ndarray, at: np.ndarray,
                last_event: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Each (B, N) float64 column for (B, N) internal ids (0 = empty slot) of requests at ``at`` (B,) seconds.

        An id beyond the table (an item added after training) has no interaction: counts 0, days NONE.
        last_event: (B,) the time of each user's newest interaction (NaN: unknown, and user_idle_days is NONE).
        """
        cand = np.where(candidates <= self.n_items, candidates, 0).astype(np.int64)
        when = np.clip(np.floor(np.asarray(at, dtype=np.float64)), 0, MAX_SECONDS).astype(np.int64)[:, None]
        keys, base = self.keys, cand << _SHIFT
        before = np.searchsorted(keys, base + when, "left")  # rows of this item strictly before ``at``
        out = {name: np.log1p(before - np.searchsorted(keys, base + np.maximum(when - span, 0), "left"))
               .astype(np.float64) for name, span in WINDOWS.items()}
        start = self.first[cand]
        seen = before > start
        last = self.times[np.maximum(before - 1, 0)] if len(self.times) else np.zeros_like(before)
        earliest = self.times[np.minimum(start, max(len(self.times) - 1, 0))] if len(self.times) else last
        out["days_since_last"] = np.where(seen, np.log1p(np.maximum(when - last, 0) / DAY), NONE)
        out["days_since_first"] = np.where(seen, np.log1p(np.maximum(when - earliest, 0) / DAY), NONE)
        idle = np.full(len(when), np.nan) if last_event is None else \
            np.asarray(at, dtype=np.float64) - np.asarray(last_event, dtype=np.float64)
        idle_days = np.where(np.isnan(idle), NONE, np.log1p(np.maximum(np.nan_to_num(idle), 0) / DAY))
        out["user_idle_days"] = np.repeat(idle_days[:, None], cand.shape[1], axis=1)
        return out
