"""What `service.http.store.MemoryStore` keeps per user, and the rule it applies: the one
`service.http.store_lua.APPEND` applies in Redis (the contract test runs both stores). Every structure costs O(1)
per event whatever the user has seen: insertion-ordered dicts, the oldest dropped past the cap."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.http.store import Event


@dataclass
class Record:
    """One user's history in `MemoryStore`: the rule `service.http.store_lua.APPEND` applies in Redis."""

    window: list[Event] = field(default_factory=list)
    seen: dict[str, None] = field(default_factory=dict)  # oldest recorded first
    cut: dict[str, None] = field(default_factory=dict)  # the items last cut from the window at cut_at, oldest first
    cut_at: float | None = None  # the newest timestamp an event was cut from the window at

    def is_duplicate(self, event: Event) -> bool:
        if event.timestamp is None:
            return False
        return (event.timestamp == self.cut_at and event.item_id in self.cut) or event in self.window

    def insert(self, event: Event) -> None:
        pos = len(self.window)
        if event.timestamp is not None:
            while pos > 0 and (t := self.window[pos - 1].timestamp) is not None and t > event.timestamp:
                pos -= 1
        self.window.insert(pos, event)

    def record_seen(self, item_id: str) -> None:
        self.seen.pop(item_id, None)
        self.seen[item_id] = None

    def trim(self, max_len: int, seen_cap: int) -> None:
        excess = max(len(self.window) - max_len, 0)
        for event in self.window[:excess]:
            t = event.timestamp
            if t is not None and (self.cut_at is None or t > self.cut_at):
                self.cut, self.cut_at = {}, t
            if t is not None and t == self.cut_at:  # as Redis's ZADD: a member added again becomes the newest
                self.cut.pop(event.item_id, None)
                self.cut[event.item_id] = None
        del self.window[:excess]
        for kept in (self.cut, self.seen):  # the oldest past the cap, never the whole set
            for item in list(islice(kept, max(len(kept) - seen_cap, 0))):
                del kept[item]
