"""``POST /recommend``."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Response
from fastapi.exceptions import RequestValidationError

from service.answer import answer
from service.deps import StateDep
from service.filters import FilterError
from service.recommend import NeedsCausalModel
from service.schemas import FOREIGN, INVALID, STORE_DOWN, TOO_LARGE, UNREADABLE, RecommendRequest, RecommendResponse

router = APIRouter()


@router.post("/recommend", response_model=RecommendResponse,
             responses={**UNREADABLE, **INVALID, **TOO_LARGE, **FOREIGN,
                        503: {**STORE_DOWN[503], "description": "user_id-only request while the history store "
                                                                 "is unreachable, or SEQREC_MAX_QUEUE requests "
                                                                 "already wait for the model (load shedding)"}})
async def recommend(body: RecommendRequest, s: StateDep) -> Response:
    # The body is built to RecommendResponse's shape (tests/service check it against the schema) and written
    # with orjson: validating and serialising it again through pydantic cost ~20x more (docs/results/serve).
    try:
        return Response(orjson.dumps(await answer(body, s.engine, s.store, s.metrics)), media_type="application/json")
    except NeedsCausalModel as err:  # a field error like any other 422
        raise RequestValidationError([{"loc": ("body", "personalize"), "type": "value_error",
                                       "msg": str(err)}]) from None
    except FilterError as err:
        raise RequestValidationError([{"loc": ("body", *err.field.split(".")), "type": "value_error",
                                       "msg": err.message}]) from None
