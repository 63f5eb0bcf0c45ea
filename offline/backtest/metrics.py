"""What one replayed window is worth: the figures of a backtest step, from the served lists.

- ``nightly``: each active user's nightly list against their next item (the window's first event);
- ``nightly_all`` and ``live``: every window event against the list the user had just before it, the nightly
  list all day long or the live list (the history including the window's earlier events); ``live_gain`` is
  the difference of their NDCG@k;
- ``recall``: the share of each user's distinct window items that their nightly list holds, averaged over users;
- ``coverage``: distinct items in the lists over the served catalogue;
- new items (first seen in the window, after the step's training data): their share of the window's events, of
  the recommended slots, and of their events that the live list hit.

A list holds k items at most; a target outside it (or unknown to the bundle) ranks k + 1: HR and NDCG from ranks
with `common.metrics`, the one definition.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.metrics import mean_metrics
from offline.backtest.replay import Replayed


def _rank(served: list[str], target: str, k: int) -> int:
    return served.index(target) + 1 if target in served else k + 1


def _figures(ranks: list[int], k: int) -> dict[str, float]:
    m = mean_metrics(np.asarray(ranks, dtype=np.int64), (k,))
    return {f"HR@{k}": m[f"HR@{k}"], f"NDCG@{k}": m[f"NDCG@{k}"], "n": len(ranks)}


def step_figures(replayed: Replayed, known_before: set[str], catalogue_size: int, k: int = 10) -> dict[str, Any]:
    """The step's figures; ``known_before``: the items seen before the step (the rest of the window's are new)."""
    users = replayed.users
    next_ranks = [_rank(served, u.during[0].item, k) for u, served in zip(users, replayed.nightly, strict=True)]
    all_nightly, all_live, new_hits, new_events = [], [], 0, 0
    for u, standing, lives in zip(users, replayed.nightly, replayed.live, strict=True):
        for e, current in zip(u.during, lives, strict=True):
            all_nightly.append(_rank(standing, e.item, k))
            all_live.append(_rank(current, e.item, k))
            if e.item not in known_before:
                new_events += 1
                new_hits += int(e.item in current)
    recall = [len(set(served) & {e.item for e in u.during}) / len({e.item for e in u.during})
              for u, served in zip(users, replayed.nightly, strict=True)]
    nightly_items = {i for served in replayed.nightly for i in served}
    live_items = {i for lives in replayed.live for served in lives for i in served}
    slots = [i for served in replayed.nightly for i in served]
    nightly, nightly_all, live = _figures(next_ranks, k), _figures(all_nightly, k), _figures(all_live, k)
    return {
        "users": len(users), "cold_users": int(sum(replayed.cold)), "events": len(all_live),
        "nightly": nightly, "nightly_all": nightly_all, "live": live,
        "live_gain": {f"NDCG@{k}": live[f"NDCG@{k}"] - nightly_all[f"NDCG@{k}"],
                      f"HR@{k}": live[f"HR@{k}"] - nightly_all[f"HR@{k}"]},
        f"recall@{k}": float(np.mean(recall)) if recall else float("nan"),
        "coverage": {"nightly": len(nightly_items) / catalogue_size, "live": len(live_items) / catalogue_size,
                     "catalogue": catalogue_size},
        "new_items": {
            "in_window": len({e.item for u in users for e in u.during} - known_before),
            "event_share": new_events / len(all_live) if all_live else 0.0,
            "recommended_share": sum(i not in known_before for i in slots) / len(slots) if slots else 0.0,
            "live_hit_share": new_hits / new_events if new_events else 0.0,
        },
    }
