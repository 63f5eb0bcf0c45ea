"""A global temporal split: one validation cut and one test cut in time, the same moment for every user.

Leave-one-out takes each user's last item wherever it falls in time, so a model learns from interactions that
happened after other users' test targets. Here (Gusak et al., "Time to Split", RecSys 2025: cuts at the 0.8 and
0.9 quantiles of the interaction times) training holds only what happened before the validation cut; the
validation window runs from that cut to the test cut, the test window from the test cut to the end. A split's
inputs are each user's history before its cut; its target the user's next item at or after the cut (and, for
recall over the window, every item of the user's window). Users with window items but no history before the cut
are cold users, counted apart and not evaluated; items first seen at or after a cut are that split's new items.

Sequences arrive in time order (stable sort by timestamp, file order on ties, done once by `seqrec prepare`), so
"before the cut" is a prefix of each user's row and the split is positional: ties never reorder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from common.errors import SeqrecError
from offline.data.prepared import PreparedDataset
from offline.data.protocols import DEFAULT_TEST_CUT, DEFAULT_VALID_CUT
from offline.data.sequences import Sequences
from offline.data.split import Split, repeat_targets


class TemporalError(SeqrecError):
    """Data or cuts the temporal protocol cannot use (no timestamps, cuts out of order, an empty window): the CLI
    exits 2, as for a usage error, since the data or the flags must change."""

    exit_code = 2


def cut_time(spec: str | float, timestamps: np.ndarray) -> float:
    """A cut given as a quantile of the interaction times (a number in (0, 1)) or a date (ISO 8601, UTC unless it
    names a zone) -> a time on the data's clock (timestamps in seconds since the epoch for a date)."""
    text = str(spec).strip()
    try:
        quantile = float(text)
    except ValueError:
        quantile = None
    if quantile is not None:
        if not 0.0 < quantile < 1.0:
            raise TemporalError(f"cut {text!r}: a quantile must lie strictly between 0 and 1 (or give a date)")
        return float(np.quantile(timestamps.astype(np.float64), quantile, method="lower"))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TemporalError(f"cut {text!r} is neither a quantile in (0, 1) nor an ISO date (2026-12-03, "
                            "2026-12-03T10:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True)
class Window:
    """One evaluated split. ``users``: rows (in the full data) of the warm users, who have history before the cut
    and an item in the window; ``inputs``/``targets``/``horizon`` are aligned with them: the history before the
    cut, the next item at or after it, every item of the window. ``new_items``: (n_items + 1,) bool, first seen
    at or after the cut. ``cold_users``: users with window items and no history before the cut (not evaluated)."""

    cut: float
    end: float
    users: np.ndarray
    inputs: Sequences
    targets: np.ndarray
    horizon: Sequences
    new_items: np.ndarray
    cold_users: int
    cold_interactions: int

    def take(self, rows: np.ndarray) -> Window:
        """The window restricted to those of its users whose full-data row is in ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        keep = np.flatnonzero(np.isin(self.users, rows))
        renumbered = np.searchsorted(np.sort(rows), self.users[keep])  # the users' rows in the restricted data
        return replace(self, users=np.argsort(rows, kind="stable")[renumbered], inputs=self.inputs.take(keep),
                       targets=self.targets[keep], horizon=self.horizon.take(keep))

    def record(self) -> dict[str, Any]:
        new_targets = self.new_items[self.targets]
        return {"cut": self.cut, "end": None if np.isinf(self.end) else self.end,
                "users": len(self.users), "cold_users": self.cold_users,
                "cold_interactions": self.cold_interactions,
                "window_interactions": int(self.horizon.lengths.sum()),
                "new_item_targets": int(new_targets.sum()),
                "new_items": int(self.new_items.sum())}


@dataclass(frozen=True)
class TemporalSplit:
    """Duck-types `offline.data.split.LeaveOneOut` for what trains and evaluates: ``train`` (every user's
    interactions before the validation cut; users without any keep an empty row), ``inputs(split)`` and
    ``targets(split)`` (the warm users of that window), ``take`` and ``full``. ``refit_train``: everything before
    the test cut, for a final fit."""

    full: Sequences
    train: Sequences
    refit_train: Sequences
    valid: Window
    test: Window
    spec: dict[str, str]

    def window(self, split: Split) -> Window:
        if split == "valid":
            return self.valid
        if split == "test":
            return self.test
        raise ValueError(f"unknown split {split!r}; expected 'valid' or 'test'")

    def inputs(self, split: Split) -> Sequences:
        return self.window(split).inputs

    def targets(self, split: Split) -> np.ndarray:
        return self.window(split).targets

    def horizon(self, split: Split) -> Sequences:
        return self.window(split).horizon

    def take(self, users: np.ndarray) -> TemporalSplit:
        """The split restricted to some users (full-data rows), e.g. a validation sample."""
        users = np.asarray(users, dtype=np.int64)
        return replace(self, full=self.full.take(users), train=self.train.take(users),
                       refit_train=self.refit_train.take(users), valid=self.valid.take(users),
                       test=self.test.take(users))

    def record(self) -> dict[str, Any]:
        """What results files repeat: the cuts as given, the times they resolved to and each window's counts."""
        return {"protocol": "temporal", **self.spec,
                "train_interactions": int(self.train.lengths.sum()),
                "refit_interactions": int(self.refit_train.lengths.sum()),
                "valid": self.valid.record(), "test": self.test.record()}


@dataclass(frozen=True)
class TemporalProtocol:
    """The cuts (quantiles of the interaction times or dates) and whether to refit before the test."""

    valid_cut: str = DEFAULT_VALID_CUT
    test_cut: str = DEFAULT_TEST_CUT
    refit: bool = False

    def split(self, sequences: Sequences, has_timestamps: bool = True) -> TemporalSplit:
        return temporal_split(sequences, self.valid_cut, self.test_cut, has_timestamps=has_timestamps)

    def split_data(self, data: PreparedDataset) -> TemporalSplit:
        """The split of a prepared folder (one prepared without timestamps is refused)."""
        return self.split(data.sequences, bool(data.manifest.get("has_timestamps", True)))

    def matches(self, record: Any) -> bool:
        """Whether an artifact's ``protocol`` record names the temporal protocol with these cuts."""
        return isinstance(record, dict) and all(record.get(key) == value for key, value in self.record().items()
                                                if key != "refit")

    def record(self) -> dict[str, Any]:
        return {"protocol": "temporal", "valid_cut": self.valid_cut, "test_cut": self.test_cut,
                "refit": self.refit}


def repeat_shares(split: TemporalSplit) -> dict[str, float]:
    """{"valid": share, "test": share} of targets that repeat an item of the user's history before the cut."""
    return {name: round(float(repeat_targets(split.inputs(name), split.targets(name)).mean()), 6)
            if len(split.targets(name)) else 0.0 for name in ("valid", "test")}


def temporal_split(sequences: Sequences, valid_cut: str | float = DEFAULT_VALID_CUT,
                   test_cut: str | float = DEFAULT_TEST_CUT, *, has_timestamps: bool = True) -> TemporalSplit:
    """Cut ``sequences`` (time-ordered rows with timestamps) at the two cuts (quantiles or dates).
    has_timestamps: False for data whose times are only the file order (`seqrec prepare` stores those)."""
    times = sequences.timestamps
    if times is None or not has_timestamps:
        raise TemporalError("the temporal protocol needs timestamps, and this data has none; prepare it from a "
                            "source with a time column (--time-col for CSV/Parquet), or use --protocol loo")
    times = np.asarray(times)
    if not np.issubdtype(times.dtype, np.number):
        times = times.astype("datetime64[s]").astype(np.int64)
    user = np.repeat(np.arange(len(sequences)), sequences.lengths)
    if len(times) > 1 and np.any((np.diff(times) < 0) & (user[1:] == user[:-1])):
        raise TemporalError("timestamps are not in time order within each user; prepare the data with "
                            "`seqrec prepare`, which sorts them")
    valid_at, test_at = cut_time(valid_cut, times), cut_time(test_cut, times)
    if not valid_at < test_at:
        raise TemporalError(f"the validation cut ({valid_cut} -> {valid_at:g}) must come before the test cut "
                            f"({test_cut} -> {test_at:g})")
    before_valid = _count_before(times, user, len(sequences), valid_at)
    before_test = _count_before(times, user, len(sequences), test_at)
    first_seen = _first_seen(sequences.items, times)
    valid = _window(sequences, before_valid, before_test, valid_at, test_at, first_seen)
    test = _window(sequences, before_test, sequences.lengths, test_at, np.inf, first_seen)
    for name, window in (("validation", valid), ("test", test)):
        if not len(window.users):
            raise TemporalError(f"the {name} window [{window.cut:g}, {window.end:g}) holds no user with history "
                                "before it; move the cuts")
    train = _prefix(sequences, before_valid)
    if train.lengths.max(initial=0) < 2:
        raise TemporalError(f"no user has two or more interactions before the validation cut ({valid_cut}); "
                            "move it later")
    spec = {"valid_cut": str(valid_cut), "test_cut": str(test_cut)}
    return TemporalSplit(sequences, train, _prefix(sequences, before_test), valid, test, spec)


def _count_before(times: np.ndarray, user: np.ndarray, n_users: int, cut: float) -> np.ndarray:
    """(n_users,) how many of each user's interactions happened before ``cut`` (a prefix: rows are in time order)."""
    return np.bincount(user[times < cut], minlength=n_users).astype(np.int64)


def _first_seen(items: np.ndarray, times: np.ndarray) -> np.ndarray:
    """(n_items + 1,) each item's first interaction time (+inf for items never seen, padding included)."""
    first = np.full(int(items.max(initial=0)) + 1, np.inf)
    np.minimum.at(first, items, times.astype(np.float64))
    return first


def _prefix(sequences: Sequences, counts: np.ndarray) -> Sequences:
    """Every user's first ``counts[u]`` items (rows may become empty)."""
    return _slice(sequences, np.zeros_like(counts), counts)


def _slice(sequences: Sequences, start: np.ndarray, end: np.ndarray) -> Sequences:
    """Row u keeps its positions [start[u], end[u])."""
    lengths = sequences.lengths
    position = np.arange(len(sequences.items)) - np.repeat(sequences.offsets[:-1], lengths)
    row_start, row_end = np.repeat(start, lengths), np.repeat(end, lengths)
    keep = (position >= row_start) & (position < row_end)
    offsets = np.concatenate([[0], np.cumsum(end - start)]).astype(np.int64)
    stamps = None if sequences.timestamps is None else sequences.timestamps[keep]
    return Sequences(offsets, sequences.items[keep], stamps)


def _window(sequences: Sequences, before: np.ndarray, until: np.ndarray, cut: float, end: float,
            first_seen: np.ndarray) -> Window:
    """The window [cut, end): positions before[u]..until[u] of each row."""
    in_window = until - before
    warm = np.flatnonzero((before > 0) & (in_window > 0))
    cold = (before == 0) & (in_window > 0)
    chosen = sequences.take(warm)
    return Window(
        cut=cut, end=end, users=warm,
        inputs=_prefix(chosen, before[warm]),
        targets=chosen.items[chosen.offsets[:-1] + before[warm]],
        horizon=_slice(chosen, before[warm], until[warm]),
        new_items=first_seen >= cut,
        cold_users=int(cold.sum()), cold_interactions=int(in_window[cold].sum()),
    )
