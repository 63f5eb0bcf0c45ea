"""``GET /items`` (catalogue search) and ``GET /items/{item_id}`` (one item's metadata)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from service.http.deps import EngineDep
from service.http.schemas import INVALID, MAX_QUERY, UNKNOWN_ITEM, ItemResponse, PathId, SearchResponse

SEARCH = "an item id, an id prefix or part of a title (case-insensitive); empty: the most popular items"

router = APIRouter()


@router.get("/items", response_model=SearchResponse, response_model_exclude_none=True, responses=INVALID)
async def find_items(engine: EngineDep, query: Annotated[str, Query(max_length=MAX_QUERY, description=SEARCH)] = "",
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    bundle = engine.bundle
    found, more = bundle.find(query, limit)
    items = [{"item_id": bundle.external(i), "popularity_rank": int(bundle.popularity_rank[i]),
              **bundle.metadata[i - 1]} for i in found]
    return {"query": query, "items": items, "more": more}


@router.get("/items/{item_id:id}", response_model=ItemResponse, response_model_exclude_none=True,
            responses={**UNKNOWN_ITEM, **INVALID})
async def get_item(item_id: PathId, engine: EngineDep) -> dict[str, Any]:
    bundle = engine.bundle
    internal = bundle.index_of.get(item_id)
    if internal is None:
        raise HTTPException(404, f"item {item_id!r} is not in the catalogue of model {bundle.version}")
    return {"item_id": item_id, **bundle.metadata[internal - 1]}
