"""``POST /recommend``. A request with a ``user_id`` reads that user's stored history and seen set (personal data,
as GET /users/{id}/history, which needs the key): with a ``history`` alone it needs no key, with a user_id it needs
the key when the service has one, checked here once the body is parsed, since only the body tells."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError

from service.http.answer import answer
from service.http.deps import BEARER, StateDep, check_key
from service.http.schemas import (
    BY_USER,
    FOREIGN,
    INVALID,
    STORE_DOWN,
    TOO_LARGE,
    UNREADABLE,
    RecommendRequest,
    RecommendResponse,
)
from service.system.filters import FilterError
from service.system.recommend import NeedsCausalModel

RESPONSES = {**UNREADABLE, **INVALID, **TOO_LARGE, **FOREIGN,
             503: {**STORE_DOWN[503], "description": "user_id-only request while the history store is unreachable, "
                                                     "or SEQREC_MAX_QUEUE requests already wait for the model (load "
                                                     "shedding)"}}
# The key as an option beside anonymous use (`{}`): a client that sends only a history needs none.
KEY_OR_NONE: dict[str, Any] = {"security": [{BEARER.scheme_name: []}, {}]}

router = APIRouter()
# The same route as a service with SEQREC_API_KEY documents it (`service.http.app` includes this router then).
guarded = APIRouter()


@guarded.post("/recommend", response_model=RecommendResponse, responses={**RESPONSES, **BY_USER},
              openapi_extra=KEY_OR_NONE)
@router.post("/recommend", response_model=RecommendResponse, responses=RESPONSES)
async def recommend(body: RecommendRequest, s: StateDep, request: Request) -> Response:
    # No dependency (the hot path, docs/results/serve): a history-only request pays one attribute test, a user_id
    # one on a service without a key a settings read too, and one on a service with a key an hmac compare.
    if body.user_id is not None and (key := s.settings.api_key_value()) is not None:
        check_key(await BEARER(request), key)
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
