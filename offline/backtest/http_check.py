"""A sample of a replayed window checked over HTTP against a real uvicorn server on a free port.

For each sampled user, on a fresh server (in-process history store) serving the step's bundle: the nightly list
as ``POST /recommend`` with the history known at the step; then the user's history before the step through
``POST /events``, and for every window event ``POST /recommend`` with the ``user_id`` (the live list) followed by
the event itself through ``POST /events``. Every list must equal the replayed one.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import httpx

from common.errors import SeqrecError
from offline.backtest.replay import Event, Replayed, UserWindow
from offline.bench.lib.processes import SERVICE_APP, start_server

log = logging.getLogger(__name__)

EVENTS_PER_REQUEST = 1000  # service.http.schemas.MAX_EVENTS
MAX_HISTORY = 10_000  # service.http.schemas.MAX_HISTORY: items per request


def sample_users(replayed: Replayed, n: int, seed: int) -> list[int]:
    """``n`` users of the window (all when fewer), the same ones for the same seed; only users whose history
    before the step fits one request (`MAX_HISTORY` items)."""
    rows = [r for r, u in enumerate(replayed.users) if len(u.before) <= MAX_HISTORY]
    return sorted(random.Random(seed).sample(rows, min(n, len(rows))))


def _recommend(client: httpx.Client, body: dict[str, Any]) -> list[str]:
    response = client.post("/recommend", json=body)
    response.raise_for_status()
    return [item["item_id"] for item in response.json()["items"]]


def _send(client: httpx.Client, user: str, events: list[Event]) -> None:
    for lo in range(0, len(events), EVENTS_PER_REQUEST):
        body = {"events": [{"user_id": user, "item_id": e.item, "timestamp": e.time}
                           for e in events[lo : lo + EVENTS_PER_REQUEST]]}
        client.post("/events", json=body).raise_for_status()


def _check_user(client: httpx.Client, u: UserWindow, nightly: list[str], live: list[list[str]], k: int,
                t0: float) -> tuple[int, int]:
    """(requests compared, lists that differ) for one user."""
    body: dict[str, Any] = {"history": [e.item for e in u.before], "k": k, "at": t0}
    if u.before:
        body["last_event_at"] = u.before[-1].time
    differ = int(_recommend(client, body) != nightly)
    _send(client, u.user, u.before)
    for e, expected in zip(u.during, live, strict=True):
        differ += int(_recommend(client, {"user_id": u.user, "k": k, "at": e.time}) != expected)
        _send(client, u.user, [e])
    return 1 + len(u.during), differ


def check_over_http(bundle: Path, replayed: Replayed, rows: list[int], t0: float, *, k: int = 10,
                    ready_timeout_s: float = 120.0) -> dict[str, Any]:
    """Serve ``bundle`` and compare the sampled users' lists; returns counts and the first users that differ."""
    if not rows:
        return {"users": 0, "lists": 0, "differ": 0, "differing_users": []}
    env = {"SEQREC_ARTIFACTS": str(bundle.resolve()), "SEQREC_THREADS": "1", "SEQREC_REDIS_URL": "",
           "SEQREC_API_KEY": ""}
    logging.getLogger("httpx").setLevel(logging.WARNING)
    compared = differ = 0
    differing: list[str] = []
    with start_server(SERVICE_APP, env, ready_timeout_s=ready_timeout_s) as url, \
            httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
        for row in rows:
            u = replayed.users[row]
            try:
                n, bad = _check_user(client, u, replayed.nightly[row], replayed.live[row], k, t0)
            except httpx.HTTPError as err:  # a refused request or a server gone: the check cannot be made
                raise SeqrecError(f"HTTP parity check of user {u.user!r} against {url}: {err}") from None
            compared, differ = compared + n, differ + bad
            if bad:
                differing.append(u.user)
    if differing:
        log.warning("HTTP parity: %d of %d lists differ (users %s)", differ, compared, differing[:10])
    return {"users": len(rows), "lists": compared, "differ": differ, "differing_users": differing[:20]}
