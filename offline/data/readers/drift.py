"""The synthetic generator with a clock that moves (``SyntheticConfig.days > 0``): a known ground truth for backtests.

The taste model is the one of `offline.data.readers.synthetic` (clusters with a fixed item order, a near successor
with ``p_next``, a popular item of the previous item's cluster with ``p_cluster``, else a popular item of a
preferred cluster), so the signal stays sequential by construction. On top of it, over ``days`` days:

- items arrive: a share ``1 - new_item_share`` exists on day 0, the rest arrive on uniform days. A cluster's order
  is its arrival order, so the items that exist on a day are a prefix of the cluster, and a successor past the
  newest one wraps to the cluster's oldest item;
- popularity shifts: an item's weight on day ``d`` is its Zipf weight halved every ``popularity_half_life`` days
  since it arrived (zero before), so the head moves to recent items;
- users arrive and leave: each user starts at a uniform time over the period and stops after their sequence length
  (or at the end of the period); a user's events come in sessions (minutes apart) separated by gaps of about a day,
  so a day's window holds several events of a user and what they did earlier that day predicts the next one.

Deterministic per seed. Rows are grouped by user in chronological order, as `synthetic.generate` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from offline.data.readers.synthetic import FloatArray, IntArray, SyntheticConfig, _Catalog

DAY = 86_400
_SESSION_GAP = 15 * 60  # mean seconds between two events of one session
_BREAK_GAP = DAY  # mean seconds between two sessions
_P_BREAK = 0.25  # an event starts a new session


@dataclass(frozen=True)
class _Drift:
    """The catalogue's state per day: who exists and how popular, as cumulative weights by day."""

    catalog: _Catalog
    arrival_day: IntArray  # (n_items,) day each internal item first exists; non-decreasing inside a cluster
    cum_weight: FloatArray  # (days, n_items) inclusive cumulative weight on each day

    existing: IntArray  # (days, n_clusters) how many items of each cluster exist on each day

    def draw_popular(self, clusters: IntArray, days: IntArray, rng: np.random.Generator) -> IntArray:
        """One item per entry, by that day's popularity within the entry's cluster (the whole catalogue when the
        cluster has no item yet)."""
        start, end = self.catalog.cluster_start[clusters], self.catalog.cluster_start[clusters + 1]
        u = rng.random(len(clusters))
        items = np.empty(len(clusters), dtype=np.int64)
        for day in np.unique(days):  # one searchsorted per day, never per row
            rows = np.flatnonzero(days == day)
            cum = self.cum_weight[day]
            s, e = start[rows], end[rows]
            lo = np.where(s > 0, cum[np.maximum(s - 1, 0)], 0.0)
            hi = cum[e - 1]
            empty = hi <= lo
            lo, hi = np.where(empty, 0.0, lo), np.where(empty, cum[-1], hi)
            found = np.searchsorted(cum, lo + u[rows] * (hi - lo), side="right")
            items[rows] = np.clip(found, np.where(empty, 0, s), np.where(empty, len(cum) - 1, e - 1))
        return items

    def successor(self, items: IntArray, days: IntArray, rng: np.random.Generator, window: int) -> IntArray:
        """An item 1..window places on among the items of its cluster that exist on that day (a prefix of the
        cluster's slice: arrival days are sorted inside a cluster)."""
        cat = self.catalog
        clusters = cat.item_cluster[items]
        start = cat.cluster_start[clusters]
        existing = np.maximum(self.existing[days, clusters], 1)  # the previous item exists, so one does
        step = np.minimum(rng.geometric(0.5, len(items)), window)
        return start + (items - start + step) % existing


def _drift(config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator) -> _Drift:
    n = config.n_items
    weight = np.diff(catalog.cum_weight, prepend=0.0)
    arrival = np.where(rng.random(n) < config.new_item_share, rng.integers(1, max(config.days, 2), n), 0)
    for c in range(config.n_clusters):  # a cluster's order is its arrival order
        lo, hi = catalog.cluster_start[c], catalog.cluster_start[c + 1]
        arrival[lo:hi] = np.sort(arrival[lo:hi])
    day = np.arange(config.days)[:, None]
    age = day - arrival[None, :]  # (days, n_items)
    daily = np.where(age >= 0, weight[None, :] * 0.5 ** (np.maximum(age, 0) / config.popularity_half_life), 0.0)
    exists = (age >= 0).astype(np.int64)  # (days, n_items)
    existing = np.add.reduceat(exists, catalog.cluster_start[:-1], axis=1)  # (days, n_clusters)
    return _Drift(catalog, arrival.astype(np.int64), np.cumsum(daily, axis=1), existing)


def _gaps(config: SyntheticConfig, n: int, rng: np.random.Generator) -> IntArray:
    mean = np.where(rng.random(n) < _P_BREAK, _BREAK_GAP, _SESSION_GAP)
    gaps = 1 + np.floor(rng.exponential(1.0, n) * mean).astype(np.int64)
    return np.where(rng.random(n) < config.tie_probability, 0, gaps)


def _transition(config: SyntheticConfig, drift: _Drift, prev: IntArray, prefs: IntArray, days: IntArray,
                rng: np.random.Generator) -> IntArray:
    r = rng.random(len(prev))
    follow = r < config.p_next
    stay = ~follow & (r < config.p_next + config.p_cluster)
    jump = ~(follow | stay)
    nxt = np.empty_like(prev)
    nxt[follow] = drift.successor(prev[follow], days[follow], rng, config.successor_window)
    nxt[stay] = drift.draw_popular(drift.catalog.item_cluster[prev[stay]], days[stay], rng)
    nxt[jump] = _preferred(drift, prefs[jump], days[jump], rng)
    return nxt


def _preferred(drift: _Drift, prefs: IntArray, days: IntArray, rng: np.random.Generator) -> IntArray:
    column = rng.integers(prefs.shape[1], size=len(prefs))
    return drift.draw_popular(prefs[np.arange(len(prefs)), column], days, rng)


def walk_with_drift(config: SyntheticConfig, catalog: _Catalog, lengths: IntArray, prefs: IntArray,
                    start_time: int, rng: np.random.Generator) -> tuple[IntArray, IntArray, IntArray]:
    """(internal item, timestamp, user) of every row before the period's end, grouped by user in time order."""
    drift = _drift(config, catalog, rng)
    end = config.days * DAY
    order = np.argsort(-lengths, kind="stable")  # longest first: the users still active at step t are a prefix
    offsets = (np.cumsum(lengths) - lengths)[order]
    n_active = np.bincount(lengths, minlength=config.max_length + 1)[::-1].cumsum()[::-1]
    prefs = prefs[order]
    items = np.empty(int(lengths.sum()), dtype=np.int64)
    times = np.empty(len(items), dtype=np.int64)

    clock = rng.integers(0, end, config.n_users)
    prev = _preferred(drift, prefs, np.minimum(clock // DAY, config.days - 1), rng)
    items[offsets], times[offsets] = prev, clock
    for t in range(1, int(lengths.max())):
        n = int(n_active[t + 1])
        clock = clock[:n] + _gaps(config, n, rng)
        prev = _transition(config, drift, prev[:n], prefs[:n], np.minimum(clock // DAY, config.days - 1), rng)
        items[offsets[:n] + t], times[offsets[:n] + t] = prev, clock
    users = np.repeat(np.arange(config.n_users), lengths)
    keep = times < end  # past the period's end the user has left the data
    return items[keep], times[keep] + start_time, users[keep]
