"""`seqrec bench parity`: what a real server returns is what `seqrec evaluate` counted, for every test user.

A uvicorn server is started on the bundle; each test user's test input (the training items and the
validation target, the history the evaluation ranks the test target after) is sent as the default
request (`history` and `k` only: depth, exclusion and reranking are the bundle's defaults; for a ranker with
request-time features also `at`, the test target's timestamp, the time the evaluation scores for, and the
time of the history's newest item, `last_event_at`). The served
top k is compared with the offline two-stage top k of `offline.jobs.rank.two_stage_top` (the scores
`seqrec evaluate` ranks the test targets with), and NDCG@k is computed from the served lists. One line
comes out; the exit code is 1 when any list differs or the two NDCG@k differ by more than the tolerance.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from common.metrics import ndcg_at
from offline.bench.lib.processes import SERVICE_APP, start_server
from offline.data.prepared import PreparedDataset, load_prepared
from offline.jobs.evaluate import two_stage_top
from ranker.groups import base_columns, requiring

log = logging.getLogger(__name__)

TOLERANCE = 0.001  # NDCG points


@dataclass(frozen=True)
class Parity:
    users: int
    k: int
    served_ndcg: float  # from the served lists: the target's position, a miss when absent
    offline_ndcg: float  # from the evaluation's ranks (ties pessimistic), as `seqrec evaluate` reports it
    differ: list[int]  # users whose served top k is not the offline one
    differ_repeats: int  # of them, users whose test target is already in their history

    @property
    def ok(self) -> bool:
        return not self.differ and abs(self.served_ndcg - self.offline_ndcg) <= TOLERANCE

    def line(self) -> str:
        return (f"parity over {self.users} test users: served NDCG@{self.k} {self.served_ndcg:.6f}, offline NDCG@"
                f"{self.k} {self.offline_ndcg:.6f} (|diff| {abs(self.served_ndcg - self.offline_ndcg):.6f}); "
                f"{len(self.differ)} users' top-{self.k} differ ({self.differ_repeats} of them with a repeat "
                f"target) -> {'OK' if self.ok else 'MISMATCH'}")


def served_lists(url: str, histories: list[list[str]], k: int, at: list[float] | None = None,
                 last_event_at: list[float] | None = None) -> list[list[str]]:
    """The top k the server at ``url`` returns for each history, one default request at a time (``at``: each
    request's time, ``last_event_at`` its newest history item's, sent when given)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    out = []
    with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
        for u, history in enumerate(histories):
            body: dict[str, Any] = {"history": history, "k": k}
            if at is not None:
                body["at"] = at[u]
            if last_event_at is not None:
                body["last_event_at"] = last_event_at[u]
            response = client.post("/recommend", json=body)
            response.raise_for_status()
            out.append([item["item_id"] for item in response.json()["items"]])
    return out


def compare(url: str, bundle: Path, data: PreparedDataset, *, k: int = 10) -> Parity:
    """Every test user's served top k (server at ``url``, serving ``bundle``) against the offline one."""
    offline, targets = two_stage_top(bundle, data, split="test", k=k)
    catalogue = _served_ids(bundle)
    inputs = data.split().inputs("test")
    histories = [catalogue[inputs.row(u) - 1].tolist() for u in range(len(inputs))]
    at = stamps = None
    if _reads_time(bundle):
        full = data.split().full
        assert full.timestamps is not None  # two_stage_top refuses a timed ranker on data without
        assert inputs.timestamps is not None
        at = [float(t) for t in full.timestamps[full.offsets[1:] - 1]]
        stamps = [float(t) for t in inputs.timestamps[inputs.offsets[1:] - 1]]
    served = served_lists(url, histories, k, at, stamps)
    expected = [catalogue[row[row > 0] - 1].tolist() for row in offline.top]
    differ = [u for u, (got, want) in enumerate(zip(served, expected, strict=True)) if got != want]
    target_ids = catalogue[targets - 1]
    served_ranks = np.array([got.index(t) + 1 if t in got else k + 1 for got, t in zip(served, target_ids,
                                                                                         strict=True)])
    repeats = sum(int(targets[u] in inputs.row(u)) for u in differ)
    return Parity(len(inputs), k, ndcg_at(served_ranks, k), ndcg_at(offline.ranks, k), differ, repeats)


def _served_ids(bundle: Path) -> np.ndarray:
    """External id of each internal id - 1: the trained items, then those added through the admin routes that the
    model gives a vector (the bundle's catalogue journal, as the service loads it)."""
    from service.system.catalog import load_served, read_journal

    changes = read_journal(bundle)
    ids = load_served(bundle, inference="eager").artifact.item_ids if changes.added else np.load(
        bundle / "item_ids.npy", allow_pickle=False)
    return np.array([str(i) for i in ids])


def _reads_time(bundle: Path) -> bool:
    """Whether the bundle's ranker reads request-time features (its manifest's feature list)."""
    manifest = bundle / "ranker" / "manifest.json"
    if not manifest.is_file():
        return False
    dense = json.loads(manifest.read_text()).get("features", {}).get("dense", [])
    return bool(requiring([name for name in dense if name not in base_columns()], "timestamps"))


def run_parity(args: argparse.Namespace) -> int:
    data = load_prepared(args.data)
    env = {"SEQREC_ARTIFACTS": str(args.artifact.resolve()), "SEQREC_THREADS": "1", "SEQREC_REDIS_URL": ""}
    with start_server(SERVICE_APP, env, ready_timeout_s=args.ready_timeout) as url:
        parity = compare(url, args.artifact, data, k=args.k)
    if parity.differ:
        log.info("first users whose lists differ (test-split rows): %s", parity.differ[:20])
    print(parity.line())
    return 0 if parity.ok else 1
