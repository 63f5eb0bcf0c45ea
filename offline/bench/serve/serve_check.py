"""Served answers against the reference path: each body sent alone over HTTP, then answered in this process by
`service.system.recommend.recommend_batch` (batch of one, eager encoder, no cache) on its own load of the bundle.

Top-k ids must be identical and scores within ``tolerance``: what `seqrec bench serve` checks after its load,
so a faster path that changes answers is caught by the bench that measures it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offline.bench.lib.load import post_json
from service.system.bundle import Bundle
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch

TOLERANCE = 1e-4


def reference_query(bundle: Bundle, body: dict[str, Any]) -> Query:
    """The query `service.http.answer.answer` builds for a history body of catalogue ids (all known)."""
    history = [bundle.index_of[str(i)] for i in body["history"]]
    used = history[-bundle.max_len:]
    exclude_seen = bundle.exclude_seen if body.get("exclude_seen") is None else body["exclude_seen"]
    candidates = body.get("candidates") or bundle.default_candidates(body.get("k", 10))
    excluded = set(history[: -bundle.max_len]) - set(used)
    return Query(used, k=body.get("k", 10), candidates=candidates, exclude_seen=exclude_seen,
                 rerank=body.get("rerank", True), exclude=tuple(sorted(excluded)) if exclude_seen else ())


def check_answers(url: str, bundle_path: Path, bodies: Sequence[dict[str, Any]],
                  tolerance: float = TOLERANCE) -> dict[str, Any]:
    """{checked, identical_topk, max_score_diff, mismatches (the first few), passed}."""
    bundle = load_bundle(bundle_path)
    mismatches: list[dict[str, Any]] = []
    worst = 0.0
    identical = 0
    for n, body in enumerate(bodies):
        status, served = post_json(url, "/recommend", body)
        (ref,) = recommend_batch(bundle, [reference_query(bundle, body)])
        ref_ids = [bundle.external(i) for i, _, _ in ref.items]
        got_ids = [item["item_id"] for item in served.get("items", [])] if status == 200 else None
        if got_ids == ref_ids:
            identical += 1
            diff = max((abs(item["score"] - score) for item, (_, score, _) in zip(served["items"], ref.items,
                                                                                 strict=True)), default=0.0)
            worst = max(worst, diff)
        elif len(mismatches) < 5:
            mismatches.append({"body": n, "status": status, "served": got_ids, "reference": ref_ids})
    return {"checked": len(bodies), "identical_topk": identical, "max_score_diff": worst,
            "tolerance": tolerance, "mismatches": mismatches,
            "passed": identical == len(bodies) and worst <= tolerance}
