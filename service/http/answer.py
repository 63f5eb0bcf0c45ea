"""A `/recommend` request answered, without HTTP: the body of `RecommendResponse`.

The history (given, or the user's stored one) is mapped to internal ids (unknown ids are reported and
ignored) and cut to the model's last ``max_len`` items; an empty one gets the most popular items, any
other is queued on the engine, which runs the two stages (`service.system.recommend`). With ``exclude_seen``, every
item of a given history is excluded, and for a stored user every item of the store's seen set, which
reaches past the window (`service.http.store`), as offline evaluation excludes the whole history. Business filters
(`service.system.filters`) restrict both answers to the eligible items.

The body is a plain dict (the route writes it with orjson: validating and serialising it through pydantic cost
~20x more, docs/results/serve) whose shape has one definition, the response models of `service.http.schemas`
that the OpenAPI document describes: `_body` and `_item_body` take and write those models' fields, in their order,
which a test holds them to.
"""

from __future__ import annotations

import time
from typing import Any

from service.http.engine import Engine
from service.http.metrics import Metrics
from service.http.schemas import RecommendedItem, RecommendRequest, RecommendResponse, Timing
from service.http.store import HistoryStore
from service.system.bundle import Bundle
from service.system.filters import eligible
from service.system.query import plan_query, popular, seen_ids
from service.system.recommend import NeedsCausalModel

# The body's keys, in the schema's order: the response models' fields, the OpenAPI document's.
RESPONSE_FIELDS = tuple(RecommendResponse.model_fields)
ITEM_FIELDS = tuple(name for name, f in RecommendedItem.model_fields.items() if f.is_required())  # then the catalogue's
NO_TIMING = dict.fromkeys(Timing.model_fields, 0.0)  # the popularity answer's stage times


def _body(items: list[dict[str, Any]], model_version: str, reranked: bool, unknown_items: list[str],
          fallback: str | None, history_used: int, timing_ms: dict[str, float]) -> dict[str, Any]:
    """A RecommendResponse body: one parameter and one key per model field, in its order (tests/service/test_answer.py
    holds both to `RESPONSE_FIELDS`)."""
    return {"items": items, "model_version": model_version, "reranked": reranked, "unknown_items": unknown_items,
            "fallback": fallback, "history_used": history_used, "timing_ms": timing_ms}


def _item_body(item_id: str, score: float, retrieval_score: float, rank: int, more: dict[str, Any]) -> dict[str, Any]:
    """A RecommendedItem: its required fields (`ITEM_FIELDS`), then the catalogue's fields when known."""
    return {"item_id": item_id, "score": score, "retrieval_score": retrieval_score, "rank": rank, **more}


async def answer(body: RecommendRequest, engine: Engine, store: HistoryStore, metrics: Metrics) -> dict[str, Any]:
    """The response body; `NeedsCausalModel` for ``personalize`` on a bidirectional model, `FilterError` for a
    filter naming an unknown column or operator, `StoreUnavailable` when a user_id-only request cannot read the
    stored history."""
    start = time.perf_counter()
    bundle = engine.bundle
    seen: frozenset[str] = frozenset()  # stored items beyond the history read here
    last_event = None  # the time of the newest interaction, when known
    if body.history is not None:
        raw = list(body.history)
    elif body.user_id is not None:
        stored = await store.read(body.user_id)
        raw, seen = [e.item_id for e in stored.events], stored.seen
        last_event = stored.events[-1].timestamp if stored.events else None
    else:
        raw = []
    known = [bundle.index_of.get(i) for i in raw]
    unknown = list(dict.fromkeys(i for i, j in zip(raw, known, strict=True) if j is None))
    history = [j for j in known if j is not None]
    # checked per request, before batching, so one bad request never fails the batch it would join
    if body.personalize and not bundle.artifact.model.causal:
        raise NeedsCausalModel(f"needs a causal model; this bundle's backbone is {bundle.artifact.manifest.backbone}")
    allowed, unknown_filtered = eligible(bundle.filters, bundle.index_of,
                                         filters=None if body.filters is None else body.filters.conditions(),
                                         include=body.include_items, exclude=body.exclude_items)
    unknown = list(dict.fromkeys([*unknown, *unknown_filtered]))
    exclude_seen = bundle.exclude_seen if body.exclude_seen is None else body.exclude_seen
    stored_seen = seen_ids(bundle, seen)
    query = plan_query(bundle, history, stored_seen, k=body.k,
                       candidates=body.candidates, exclude_seen=exclude_seen, rerank=body.rerank,
                       personalize=body.personalize, allowed=allowed,
                       user=body.user_id if body.history is None else None, at=body.at,
                       last_event=last_event if body.last_event_at is None else body.last_event_at)
    if query is None:
        metrics.fallbacks.labels("popularity").inc()
        top = popular(bundle, body.k, {*history, *stored_seen} if exclude_seen else set(), allowed)
        return _popular(bundle, top, unknown, start)
    queued = time.perf_counter()
    result = await engine.recommend(query, bundle)  # the bundle the ids were mapped with
    done = time.perf_counter()  # one clock reading for both: queue + the stages never exceed total
    total = 1000 * (done - start)
    compute = sum(result.timing_ms.values())
    for stage, ms in result.timing_ms.items():
        metrics.stages.labels(stage).observe(ms / 1000)
    items = [_item(result.bundle, i, score, retrieval, r + 1) for r, (i, score, retrieval) in enumerate(result.items)]
    return _body(items, result.bundle.version, result.reranked, unknown, None, len(query.history),
                 {"queue": max(0.0, 1000 * (done - queued) - compute), **result.timing_ms, "total": total})


def _popular(bundle: Bundle, top: list[int], unknown: list[str], start: float) -> dict[str, Any]:
    items = [_item(bundle, i, float(bundle.popularity[i]), 0.0, r + 1) for r, i in enumerate(top)]
    total = 1000 * (time.perf_counter() - start)
    return _body(items, bundle.version, False, unknown, "popularity", 0, {**NO_TIMING, "total": total})


def _item(bundle: Bundle, internal: int, score: float, retrieval: float, rank: int) -> dict[str, Any]:
    return _item_body(bundle.external(internal), score, retrieval, rank, bundle.metadata[internal - 1])
