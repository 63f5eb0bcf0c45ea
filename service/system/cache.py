"""Per-bundle caches of what a request would otherwise recompute.

`UserVectors` keeps, for stored users (``user_id`` requests), the unit user vector of the history it was
computed from. A hit needs the same user *and* the same history, so an entry goes stale by itself when
``/events`` appends (the next request reads a longer history and replaces it), in every worker, with no
message between workers; ``/events`` also drops the entry in the worker that took the append. Each bundle
has its own cache, so a reload starts from an empty one: the key is (bundle, user, history).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

DEFAULT_USERS = 10_000  # entries kept, least recently used first out: ~1 KB per user at 200 items, D = 64


class UserVectors:
    """A bounded LRU map: user id -> (history, unit user vector). Thread-safe: the inference thread reads and
    writes it, the event loop drops entries."""

    def __init__(self, capacity: int = DEFAULT_USERS) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[bytes, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(history: Sequence[int]) -> bytes:
        return np.asarray(history, dtype=np.int64).tobytes()

    def get(self, user: str, history: Sequence[int]) -> torch.Tensor | None:
        """The vector stored for ``user`` when it was computed from exactly ``history``."""
        key = self._key(history)
        with self._lock:
            entry = self._entries.get(user)
            if entry is None or entry[0] != key:
                self.misses += 1
                return None
            self._entries.move_to_end(user)
            self.hits += 1
            return entry[1]

    def put(self, user: str, history: Sequence[int], vector: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        entry = (self._key(history), vector.clone())
        with self._lock:
            self._entries[user] = entry
            self._entries.move_to_end(user)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def drop(self, user: str) -> None:
        with self._lock:
            self._entries.pop(user, None)

    def __len__(self) -> int:
        return len(self._entries)
