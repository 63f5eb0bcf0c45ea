"""The service's request and response models, and the error answers each route documents.

Request bodies are strict (no silent coercion) and refuse unknown fields; ids may be JSON
strings or integers and are matched as strings against the catalogue's external ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    model_serializer,
)
from starlette.convertors import PathConvertor, register_url_convertor

from ranker.config import MAX_DEPTH

MAX_HISTORY = 10_000  # items per request; the model reads its last max_len of them
MAX_EVENTS = 1_000  # events per batch request
MAX_QUERY = 200  # characters of a catalogue search


def _id_string(value: Any) -> Any:
    """Item ids may be sent as JSON ints or strings; both match the catalogue's external ids."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _encodable(value: str) -> str:
    """JSON escapes can spell lone surrogates ("\\ud800") that no response body or Redis key can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


ItemId = Annotated[str, BeforeValidator(_id_string), StringConstraints(min_length=1, max_length=256),
                   AfterValidator(_encodable),
                   WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1, "maxLength": 256},
                                             {"type": "integer"}]})]


def _plain_ids(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A list of item ids checked at once when every id is plainly valid (a string of 1-256 characters or an
    int, all valid Unicode): ~10x cheaper than one validator call per id. Anything else goes through the
    per-id validation, which names the offending position (`history.3`)."""
    if type(value) is list and len(value) <= MAX_HISTORY:
        ids = [str(v) if type(v) is int else v for v in value]
        if all(type(v) is str and 0 < len(v) <= 256 for v in ids):
            try:
                "".join(ids).encode("utf-8")
            except UnicodeEncodeError:
                return handler(value)
            return ids
    return handler(value)


ItemIds = Annotated[list[ItemId], WrapValidator(_plain_ids)]
UserId = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_encodable)]
# A user or item id as a path segment (`{name:id}`), whose percent-decoded bytes must be UTF-8 (`deps.utf8_path`:
# the server decodes a bad byte as U+FFFD, so %FF, %FE and %EF%BF%BD named one user)
PathId = Annotated[str, Path(min_length=1, max_length=256)]


def _whole_number(value: Any) -> Any:
    """JSON Schema counts 10.0 as an integer; strict pydantic would not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Count = Annotated[int, BeforeValidator(_whole_number)]
# the bounds before the validator, so that the OpenAPI document says minimum/maximum inside the Optional
Depth = Annotated[int, Field(ge=1, le=MAX_DEPTH), BeforeValidator(_whole_number)]


class _AnyText(PathConvertor):
    """Path segments for ids, which come unrestricted in JSON bodies: a client sends "a/b" or "a\nb" as %2F or
    %0A, decoded before routing, so the default ``[^/]+`` (or ``path``'s ``.*``, blind to newlines) would 404.
    The decoding replaced bytes that are not UTF-8 with U+FFFD; `deps.utf8_path` refuses those paths."""

    regex = "(?s:.*)"


register_url_convertor("id", _AnyText())


class Strict(BaseModel):
    """Request bodies take what their schema says, no more: `"k": "10"`, `"rerank": 0` or `"timestamp": false`
    are 422s, not silently coerced (item ids excepted: ints are documented and mapped to strings)."""

    model_config = ConfigDict(extra="forbid", strict=True)


Number = float  # strict pydantic takes JSON integers for a float, never booleans or strings


def _as_condition(value: Any) -> Any:
    """A bare list means `in`, a bare value `eq`; an object names its operators."""
    if isinstance(value, list):
        return {"in": value}
    if isinstance(value, dict):
        return value
    return {"eq": value}


def _condition_schema(operand: dict[str, Any], orders: bool) -> dict[str, Any]:
    ops = ["eq", "ne", *(["gte", "gt", "lte", "lt"] if orders else [])]
    many = {"type": "array", "items": operand, "minItems": 1}
    unset = {"type": "null"}  # an operator given as null is not given
    condition = {"type": "object", "additionalProperties": False,
                 "properties": {**{op: {"anyOf": [operand, unset]} for op in ops}, "in": {"anyOf": [many, unset]}}}
    return {"anyOf": [operand, many, condition]}


class TextCondition(Strict):
    """List columns (genres, attributes): eq = has it, ne = lacks it, in = has any; title: equals."""

    eq: str | None = None
    ne: str | None = None
    in_: list[str] | None = Field(None, alias="in", min_length=1)


class NumberCondition(Strict):
    eq: Number | None = None
    ne: Number | None = None
    in_: list[Number] | None = Field(None, alias="in", min_length=1)
    gte: Number | None = None
    gt: Number | None = None
    lte: Number | None = None
    lt: Number | None = None


TextFilter = Annotated[TextCondition, BeforeValidator(_as_condition),
                       WithJsonSchema(_condition_schema({"type": "string"}, orders=False))]
NumberFilter = Annotated[NumberCondition, BeforeValidator(_as_condition),
                         WithJsonSchema(_condition_schema({"type": "number"}, orders=True))]


class Filters(Strict):
    """Conditions on the catalogue's columns, all of which must hold; an item without a value in a column (or a
    catalogue without the column) matches no condition on it. See `service.filters`."""

    genres: TextFilter | None = None
    attributes: TextFilter | None = None
    year: NumberFilter | None = None
    title: TextFilter | None = None

    def conditions(self) -> dict[str, dict[str, Any]]:
        """``{column: {operator: operand}}`` of the conditions given."""
        out = {}
        for column in type(self).model_fields:
            condition = getattr(self, column)
            if condition is not None:
                out[column] = condition.model_dump(by_alias=True, exclude_none=True)
        return out


class RecommendRequest(Strict):
    user_id: UserId | None = Field(None, description="use the stored history when `history` is absent")
    history: ItemIds | None = Field(None, max_length=MAX_HISTORY,
                                    description="item ids, oldest first; the last max_len are read")
    k: Count = Field(10, ge=1, le=1000, description="items to return")
    candidates: Depth | None = Field(None, description=(
        "retrieval depth (at least k is retrieved); default: the depth the bundle's ranker was trained and "
        "evaluated at (`candidates` in GET /readyz; k without a ranker). A deeper request works, but its quality "
        "was never measured"))
    exclude_seen: bool | None = Field(None, description="never recommend an item of the history; default: the "
                                      "bundle's repeat policy (true under exclude, false under allow)")
    rerank: bool = Field(True, description="rerank the candidates with the bundle's ranker")
    personalize: bool = Field(False, description="PCRec-simple: one gradient step on this history first "
                                                 "(causal models; costs ~10-30 ms)")
    exclude_items: list[ItemId] | None = Field(None, max_length=MAX_HISTORY, description=(
        "item ids never to return (ids unknown to the catalogue are ignored and listed in `unknown_items`)"))
    include_items: list[ItemId] | None = Field(None, max_length=MAX_HISTORY, description=(
        "an allow-list: return only these items (unknown ids ignored and listed in `unknown_items`)"))
    filters: Filters | None = Field(None, description=(
        'conditions on catalogue columns, all of which must hold: `{"genres": ["Comedy"]}` (any of), '
        '`{"year": {"gte": 1990}}`; operators eq, ne, in, gte, gt, lte, lt; an unknown column, operator or '
        "operand type is a 422. Candidates are drawn from the eligible items only, so k items come back "
        "whenever k eligible items (outside an excluded history) exist"))
    at: float | None = Field(None, ge=0, le=1e11, description=(
        "the time (unix seconds) to recommend for; read only by a ranker trained with request-time features "
        "(`recent_30d`, ...), which is evaluated offline as of each target's time; default: the server's clock"))
    last_event_at: float | None = Field(None, ge=0, le=1e11, description=(
        "the time (unix seconds) of the user's newest interaction, read by a ranker with `user_idle_days`; "
        "default: the stored history's newest event timestamp (a sent `history` has none)"))


class RecommendedItem(BaseModel):
    item_id: str
    score: float
    retrieval_score: float
    rank: int
    title: str | None = None
    year: int | None = None
    genres: list[str] | None = None
    attributes: list[str] | None = None

    # Unannotated on purpose: a return annotation would replace this model's schema in the OpenAPI document.
    @model_serializer(mode="wrap")
    def _catalogue_fields_only_when_known(self, handler: SerializerFunctionWrapHandler):
        """title/year/genres/attributes appear when the catalogue has them (the response's `fallback` stays
        present as null, which a route-wide `response_model_exclude_none` would drop)."""
        return {name: value for name, value in handler(self).items() if value is not None}


class Timing(BaseModel):
    queue: float
    encode: float
    search: float
    rerank: float
    total: float


class RecommendResponse(BaseModel):
    items: list[RecommendedItem]
    model_version: str
    reranked: bool
    unknown_items: list[str]
    fallback: Literal["popularity"] | None
    history_used: int = Field(description="known history items the model read")
    timing_ms: Timing


class EventIn(Strict):
    user_id: UserId
    item_id: ItemId
    timestamp: float | None = Field(None, ge=0, le=1e11, description="unix seconds")


class EventBatch(Strict):
    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS)


class EventsResponse(BaseModel):
    stored: int
    users: int
    unknown_items: list[str]


class HistoryItem(BaseModel):
    item_id: str
    timestamp: float | None = None


class HistoryResponse(BaseModel):
    user_id: str
    items: list[HistoryItem]


class ItemResponse(BaseModel):
    item_id: str
    title: str | None = None
    year: int | None = None
    genres: list[str] | None = None
    attributes: list[str] | None = None


class FoundItem(ItemResponse):
    popularity_rank: int = Field(description="1 = the most popular training item")


class SearchResponse(BaseModel):
    query: str
    items: list[FoundItem] = Field(description="the item whose id is the query first, then id-prefix and "
                                               "title matches, most popular first")
    more: bool = Field(description="more items match than `limit`")


class ReloadResponse(BaseModel):
    status: Literal["reloaded", "unchanged"]
    model_version: str
    previous_version: str
    seconds: float


class DeleteResponse(BaseModel):
    user_id: str
    deleted: bool = Field(description="whether there was a history to delete")


class NewItem(Strict):
    """An item added without retraining; its columns must be columns of the served catalogue."""

    item_id: ItemId
    title: str | None = Field(None, max_length=1000)
    # The bounds before the validator and inside the Optional: after a BeforeValidator, pydantic writes them into
    # the schema as `ge`/`le`, which JSON Schema ignores (the fuzzer then sends -1 as valid and gets a 422)
    year: Annotated[int, Field(ge=0, le=10_000), BeforeValidator(_whole_number)] | None = None
    genres: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] | None = Field(None, max_length=100)
    attributes: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] | None = Field(
        None, max_length=100, description="e.g. Beauty's brand and category ids (a model trained with "
                                          "`model.item_features: attributes` gives the item a vector from them)")


class AddItemsRequest(Strict):
    items: list[NewItem] = Field(min_length=1, max_length=MAX_EVENTS)


class AddedItem(BaseModel):
    item_id: str
    retrievable: bool = Field(description="recommended from now on (a vector from its item features); false: "
                                          "kept for the next training, not served until then")
    known_features: int = Field(description="feature values the model was trained with")
    reason: str | None = None


class CatalogueChangeResponse(BaseModel):
    model_version: str
    items: list[AddedItem] = Field(default_factory=list)
    n_items: int = Field(description="items the served model can recommend or read (added ones included)")
    pending: int = Field(description="added items that wait for the next training")
    retired: int = Field(description="items never recommended again")


class RetireResponse(BaseModel):
    item_id: str
    retired: bool
    already: bool = Field(description="it was retired before this request")
    model_version: str


class Problem(BaseModel):
    detail: str


class FieldError(BaseModel):
    field: str = Field(description="dotted path of the offending value: `history.3`, `path.user_id`, `body`")
    message: str
    type: str


class InvalidRequest(BaseModel):
    detail: str = Field(description="every field error on one line")
    errors: list[FieldError]


# The answers the routes really give besides 200, documented so that clients (and the schema fuzzer) can rely on them.
Responses = dict[int | str, dict[str, Any]]
TEXT = {"text/plain": {"schema": {"type": "string"}}}
INVALID: Responses = {422: {"model": InvalidRequest, "description": "a field is missing, malformed or out of range"}}
UNREADABLE: Responses = {400: {"model": Problem, "description": "the body is not text (not UTF-8), so not JSON"}}
UNAUTHORIZED: Responses = {401: {"model": Problem, "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
                                  "description": "SEQREC_API_KEY is set and `Authorization: Bearer <key>` is not"}}
# POST /recommend's: only a body that names a user (its stored history and seen set) needs the key
BY_USER: Responses = {401: {**UNAUTHORIZED[401], "description": "SEQREC_API_KEY is set, the body has a `user_id` and "
                                                                "`Authorization: Bearer <key>` is not (a body with "
                                                                "only a `history` needs no key)"}}
TOO_LARGE: Responses = {413: {"description": "body over SEQREC_MAX_BODY_BYTES", "content": TEXT}}
STORE_DOWN: Responses = {503: {"model": Problem, "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                                "description": "history store unreachable, refusing writes or too slow: retry. "
                                               "Refused, a write stored nothing; timed out (the detail says 'did "
                                               "not answer in time'), it may still be stored, and a retry can "
                                               "store an event without a timestamp twice"}}
FOREIGN: Responses = {409: {"model": Problem, "description": "the user's stored history holds values seqrec did not "
                                                             "write (another program's, under the key prefix); "
                                                             "DELETE /users/{user_id}/history clears it"}}
UNKNOWN_ITEM: Responses = {404: {"model": Problem, "description": "the item is not in the served catalogue"}}
CONFLICT: Responses = {409: {"model": Problem, "description": "an id already in the catalogue (or twice in the "
                                                              "request), or a column the served catalogue lacks"}}
JOURNAL_DOWN: Responses = {503: {"model": Problem, "description": "the catalogue journal could not be written: "
                                                                  "nothing changed, retry"}}
REFUSED: Responses = {409: {"model": Problem, "description": "the new bundle was refused; the old one keeps serving"}}
METRICS: Responses = {200: {"description": "Prometheus text exposition", "content": TEXT}}
