"""Users' item sequences in CSR form: one flat array of items and per-user offsets.

CSR keeps 20M interactions in two numpy arrays instead of millions of Python lists,
and every operation here is vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sequences:
    """offsets: (n_users + 1,) int64, user u's items are items[offsets[u]:offsets[u + 1]].
    items: (n_interactions,) int64 internal item ids (>= 1; 0 is padding).
    timestamps: (n_interactions,) aligned with items, or None.
    """

    offsets: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or len(self.offsets) == 0 or self.offsets[0] != 0:
            raise ValueError("offsets must be a 1-D array starting at 0")
        if self.offsets[-1] != len(self.items) or np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing and end at len(items)")
        if self.timestamps is not None and len(self.timestamps) != len(self.items):
            raise ValueError("timestamps must align with items")

    @classmethod
    def from_lists(cls, rows: list[list[int]]) -> Sequences:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(offsets[-1]))
        return cls(offsets, items)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, user: int) -> np.ndarray:
        return self.items[self.offsets[user] : self.offsets[user + 1]]

    def to_lists(self) -> list[list[int]]:
        return [self.row(u).tolist() for u in range(len(self))]

    def drop_last(self, n: int = 1) -> Sequences:
        """Every user's sequence without its last ``n`` items (users must have more than n)."""
        lengths = self.lengths
        if np.any(lengths <= n):
            raise ValueError(f"every sequence needs more than {n} items to drop {n}")
        keep = np.ones(len(self.items), dtype=bool)
        for back in range(1, n + 1):
            keep[self.offsets[1:] - back] = False
        offsets = np.concatenate([[0], np.cumsum(lengths - n)]).astype(np.int64)
        timestamps = None if self.timestamps is None else self.timestamps[keep]
        return Sequences(offsets, self.items[keep], timestamps)

    def take(self, rows: np.ndarray) -> Sequences:
        """The sequences of the given users (row indices), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Flat positions of every kept interaction: each start repeated over its length, plus 0..len-1.
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        timestamps = None if self.timestamps is None else self.timestamps[index]
        return Sequences(offsets, self.items[index], timestamps)

    def last(self, back: int = 1) -> np.ndarray:
        """The item ``back`` positions from each sequence's end (1 = the last item)."""
        if np.any(self.lengths < back):
            raise ValueError(f"every sequence needs at least {back} items")
        return self.items[self.offsets[1:] - back]

    def padded(self, rows: np.ndarray, max_len: int | None = None, left: bool = True) -> np.ndarray:
        """(B, T) int64 matrix of the given users' sequences, 0-padded.

        max_len keeps only each sequence's most recent items. Left padding puts every
        sequence's last item in the last column, where causal encoders read the user.
        """
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        if max_len is not None:
            starts = np.maximum(starts, ends - max_len)
        lengths = ends - starts
        width = int(lengths.max()) if len(rows) else 0
        out = np.zeros((len(rows), width), dtype=np.int64)
        if width == 0:
            return out
        # Column c of row b holds items[starts[b] + c - shift[b]] where that lies in range.
        cols = np.arange(width)
        shift = width - lengths if left else np.zeros_like(lengths)
        source = starts[:, None] + cols[None, :] - shift[:, None]
        valid = (cols[None, :] >= shift[:, None]) & (cols[None, :] < shift[:, None] + lengths[:, None])
        out[valid] = self.items[source[valid]]
        return out
