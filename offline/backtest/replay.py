"""One window replayed through the served system, in process: the nightly lists and the live lists.

Both go through the functions behind ``POST /recommend`` (`service.system.query.plan_query`, `popular`,
`service.system.recommend.recommend_batch`), as `seqrec recommend` calls them:

- the nightly list of a user active in the window is the answer to a request that sends the history known at the
  step (every interaction before it), as `seqrec recommend` precomputes it at night;
- the live list before each window event is the answer to a ``user_id`` request after the user's earlier events
  reached the store through ``POST /events``: the store keeps the newest ``max_len`` events (an event repeating
  the same item at the same time is not added twice) and every item seen, which the request excludes
  (`service.http.store_memory.Record`; `offline.backtest.http_check` holds the two to the real server).

Events are in time order, so the history before event j is the events before it: the live queries are all known
in advance and go through ``recommend_batch`` in batches, as the service's engine batches concurrent requests.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from offline.backtest.timeline import Timeline
from service.system.bundle import Bundle
from service.system.query import plan_query, popular, seen_ids
from service.system.recommend import Query, recommend_batch

BATCH = 256


@dataclass(frozen=True)
class Event:
    item: str
    time: float


@dataclass
class UserWindow:
    user: str
    before: list[Event]  # what happened before the step, oldest first
    during: list[Event]  # the window's events, in time order


@dataclass
class Replayed:
    users: list[UserWindow]
    nightly: list[list[str]]  # per user: the list served with the history known at the step
    live: list[list[list[str]]]  # per user, per window event: the list served just before it
    cold: list[bool] = field(default_factory=list)  # per user: no known item at the step (the popularity answer)


def user_windows(timeline: Timeline, t0: float, t1: float) -> list[UserWindow]:
    """Every user active in [t0, t1), in the order of their first event there, with what they did before."""
    part = timeline.window(t0, t1)
    active = list(dict.fromkeys(timeline.users[part].tolist()))
    wanted = set(active)
    rows: dict[str, list[int]] = {u: [] for u in active}
    for row in np.flatnonzero([u in wanted for u in timeline.users[: part.stop]]):
        rows[timeline.users[row]].append(int(row))
    out = []
    for user in active:
        events = [Event(str(timeline.items[r]), float(timeline.times[r])) for r in rows[user]]
        cut = sum(1 for r in rows[user] if r < part.start)
        out.append(UserWindow(user, events[:cut], events[cut:]))
    return out


def _known(bundle: Bundle, events: Sequence[Event]) -> list[int]:
    return [j for e in events if (j := bundle.index_of.get(e.item)) is not None]


def _nightly_query(bundle: Bundle, user: UserWindow, k: int, at: float) -> tuple[Query | None, list[int]]:
    history = _known(bundle, user.before)
    last = user.before[-1].time if user.before else None
    return plan_query(bundle, history, set(), k=k, candidates=None, exclude_seen=bundle.exclude_seen,
                      at=at, last_event=last), history


def stored_window(events: Sequence[Event], max_len: int) -> list[Event]:
    """The store's window after ``events`` arrived in time order: duplicates (same item, same time) skipped, the
    newest ``max_len`` kept."""
    window: list[Event] = []
    for e in events:
        if not _repeats_tie(window, e):
            window.append(e)
    return window[-max_len:]


def _repeats_tie(window: list[Event], event: Event) -> bool:
    """Whether ``event``'s item is among the window's newest events at the same time (they come last)."""
    for previous in reversed(window):
        if previous.time != event.time:
            return False
        if previous.item == event.item:
            return True
    return False


def _live_query(bundle: Bundle, arrived: Sequence[Event], k: int, at: float) -> tuple[Query | None, set[int]]:
    window = stored_window(arrived, bundle.max_len)
    history = _known(bundle, window)
    seen = seen_ids(bundle, frozenset(e.item for e in arrived))
    last = window[-1].time if window else None
    query = plan_query(bundle, history, seen, k=k, candidates=None, exclude_seen=bundle.exclude_seen, at=at,
                       last_event=last)
    return query, {*history, *seen}


def _answer(bundle: Bundle, planned: Sequence[tuple[Query | None, Collection[int]]], k: int) -> list[list[str]]:
    """Each query's top k as external ids; a None query gets the popularity answer, as the service gives it."""
    queries = [q for q, _ in planned if q is not None]
    results = []
    for lo in range(0, len(queries), BATCH):
        results.extend(recommend_batch(bundle, queries[lo : lo + BATCH]))
    answered = iter(results)
    out = []
    for query, seen in planned:
        if query is None:
            top = popular(bundle, k, set(seen) if bundle.exclude_seen else set())
        else:
            top = [i for i, _, _ in next(answered).items]
        out.append([bundle.external(i) for i in top])
    return out


def replay(bundle: Bundle, users: list[UserWindow], t0: float, k: int = 10) -> Replayed:
    nightly = [_nightly_query(bundle, u, k, t0) for u in users]
    live_plan = [_live_query(bundle, [*u.before, *u.during[:j]], k, e.time)
                 for u in users for j, e in enumerate(u.during)]
    nightly_lists = _answer(bundle, nightly, k)
    flat = iter(_answer(bundle, live_plan, k))
    live = [[next(flat) for _ in u.during] for u in users]
    return Replayed(users, nightly_lists, live, [q is None for q, _ in nightly])
