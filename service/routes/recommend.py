"""``POST /recommend``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError

from service.answer import answer
from service.deps import StateDep
from service.filters import FilterError
from service.recommend import NeedsCausalModel
from service.schemas import INVALID, STORE_DOWN, TOO_LARGE, UNREADABLE, RecommendRequest, RecommendResponse

router = APIRouter()


@router.post("/recommend", response_model=RecommendResponse,
             responses={**UNREADABLE, **INVALID, **TOO_LARGE,
                        503: {**STORE_DOWN[503], "description": "user_id-only request while the history store "
                                                                 "is unreachable"}})
async def recommend(body: RecommendRequest, s: StateDep) -> dict[str, Any]:
    try:
        return await answer(body, s.engine, s.store, s.metrics)
    except NeedsCausalModel as err:  # a field error like any other 422
        raise RequestValidationError([{"loc": ("body", "personalize"), "type": "value_error",
                                       "msg": str(err)}]) from None
    except FilterError as err:
        raise RequestValidationError([{"loc": ("body", *err.field.split(".")), "type": "value_error",
                                       "msg": err.message}]) from None
