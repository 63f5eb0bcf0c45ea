"""``POST /events``: one event or a batch, appended to the users' stored histories."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.http.deps import EngineDep, StoreDep
from service.http.schemas import (
    FOREIGN,
    INVALID,
    STORE_DOWN,
    TOO_LARGE,
    UNREADABLE,
    EventBatch,
    EventIn,
    EventsResponse,
)
from service.http.store import Event

keyed = APIRouter()


@keyed.post("/events", response_model=EventsResponse,
            responses={**UNREADABLE, **INVALID, **TOO_LARGE, **STORE_DOWN, **FOREIGN})
async def events(body: EventIn | EventBatch, engine: EngineDep, store: StoreDep) -> dict[str, Any]:
    batch = body.events if isinstance(body, EventBatch) else [body]
    per_user: dict[str, list[Event]] = {}
    for e in batch:
        per_user.setdefault(e.user_id, []).append(Event(e.item_id, e.timestamp))
    bundle = engine.bundle
    if len(per_user) == 1:
        ((user, evs),) = per_user.items()
        await store.append(user, evs, bundle.max_len)
    else:
        await store.append_many(list(per_user.items()), bundle.max_len)
    for user in per_user:  # their next request reads a longer history (other workers see that by themselves)
        bundle.user_cache.drop(user)
    unknown = list(dict.fromkeys(e.item_id for e in batch if e.item_id not in bundle.index_of))
    return {"stored": len(batch), "users": len(per_user), "unknown_items": unknown}
