"""Optional: as of the request's time `at` (`ranker.times`): how recently, and how often lately, each candidate was
interacted with in training, and how long the user has been idle. Needs timestamps."""

from __future__ import annotations

from ranker.groups import Columns, FeatureGroup, Inputs, TableKind, register, register_table
from ranker.times import TIMES_FILE, TimeTable

COLUMNS = ("recent_30d", "recent_7d", "days_since_last", "days_since_first", "user_idle_days")


def _build(_offsets: object, items: object, times: object, n_items: int) -> TimeTable:
    if times is None:
        raise ValueError(f"the request-time ranker features ({', '.join(COLUMNS)}) need timestamps")
    return TimeTable.build(items, times, n_items)  # type: ignore[arg-type]


TABLE = register_table(TableKind("times", TIMES_FILE, _build, TimeTable.load))


def _compute(x: Inputs) -> Columns:
    times = x.tables.get("times")
    if times is None or x.at is None:
        raise ValueError(f"ranker features {list(COLUMNS)} need the training interactions' times and each "
                         "request's time")
    return times.columns(x.candidates, x.at.numpy(), None if x.last_event is None else x.last_event.numpy())


GROUP = register(FeatureGroup(
    "request_time", COLUMNS, _compute, tables=("times",), requires=("timestamps",),
    doc="log1p(the candidate's training interactions in the 30 and the 7 days before `at`); log1p(days from its "
        "last and its first training interaction before `at`), -1 when none; log1p(days from the user's newest "
        "interaction to `at`), -1 when its time is unknown"))
