"""``GET`` and ``DELETE /users/{user_id}/history``: a user's stored history. Both need the API key when the
service has one: a history is personal data, so reading it is guarded as forgetting it is."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.http.deps import StoreDep
from service.http.schemas import FOREIGN, INVALID, STORE_DOWN, DeleteResponse, HistoryResponse, PathId

keyed = APIRouter()


@keyed.get("/users/{user_id:id}/history", response_model=HistoryResponse, response_model_exclude_none=True,
           responses={**INVALID, **STORE_DOWN, **FOREIGN})
async def get_history(user_id: PathId, store: StoreDep) -> dict[str, Any]:
    events = await store.history(user_id)
    return {"user_id": user_id, "items": [{"item_id": e.item_id, "timestamp": e.timestamp} for e in events]}


@keyed.delete("/users/{user_id:id}/history", response_model=DeleteResponse, responses={**INVALID, **STORE_DOWN})
async def delete_history(user_id: PathId, store: StoreDep) -> dict[str, Any]:
    return {"user_id": user_id, "deleted": await store.delete(user_id)}
