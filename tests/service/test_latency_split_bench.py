"""`python -m offline.bench.serve.latency_split`: an answer's latency split with the service's own timer, the
percentiles and the slowest requests' composition, and the in-process stage times with and without a gap."""

from pathlib import Path

import numpy as np
import pytest

from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.serve.latency_split import PARTS, gap_costs, split_answer, split_markdown, summarise_split
from service.system.loader import load_bundle
from service.system.recommend import Query


def test_outside_is_what_the_service_timer_and_the_client_lateness_leave_of_the_latency() -> None:
    timing = {"queue": 0.5, "encode": 1.0, "search": 0.25, "rerank": 0.75, "total": 3.0}
    parts = split_answer(10.0, 2.0, timing)
    assert parts["outside"] == pytest.approx(5.0)
    assert {k: parts[k] for k in ("queue", "encode", "search", "rerank")} == {k: timing[k] for k in
                                                                               ("queue", "encode", "search", "rerank")}
    assert set(parts) == set(PARTS)


def test_the_slowest_percent_is_read_at_the_latency_p99_and_averages_every_part() -> None:
    rows = [split_answer(float(ms), 0.0, {"queue": 0.0, "encode": 1.0, "search": 0.0, "rerank": 0.0,
                                          "total": float(ms)}) for ms in range(1, 201)]
    rows[-1]["queue"] = 150.0  # only the slowest answers carry a queue
    rows[-2]["queue"] = 50.0
    summary = summarise_split(rows)
    assert summary["answers"] == 200
    assert summary["quantiles"]["50"]["latency"] == pytest.approx(np.percentile(np.arange(1, 201), 50))
    assert summary["quantiles"]["99"]["latency"] == pytest.approx(np.percentile(np.arange(1, 201), 99), abs=1e-3)
    slow = summary["slowest_1pct_mean"]
    assert slow["latency"] == pytest.approx(199.5)  # the two answers at or past the p99 (198.01)
    assert slow["queue"] == pytest.approx(100.0)
    assert slow["outside"] == pytest.approx(0.0)


def test_gap_costs_times_the_same_queries_hot_and_after_an_idle_gap(bundle: Path) -> None:
    served = load_bundle(bundle)
    payloads = payloads_from_catalogue(load_catalogue(bundle), 6, 3, 10, 0, candidates=20)
    queries = [Query([served.index_of[i] for i in p["history"]], k=5, candidates=20) for p in payloads]
    costs = gap_costs(served, queries, 0.002)
    assert costs["gap_ms"] == 2.0
    for name in ("back_to_back", "after_gap", "after_spin"):
        assert set(costs[name]) == {"encode", "search", "rerank", "total"}
        assert all(ms > 0 for ms in costs[name].values())
        assert costs[name]["total"] >= costs[name]["encode"]
    assert costs["ratio"]["total"] == round(costs["after_gap"]["total"] / costs["back_to_back"]["total"], 2)
    assert costs["spin_ratio"]["total"] == round(costs["after_spin"]["total"] / costs["back_to_back"]["total"], 2)
    report = {"rate": 500.0, "seconds": 1.0, "runs": 1, "requests": 6, "load_average_before": [0.1, 0.1, 0.1],
              "load_average_after": [0.2, 0.1, 0.1],
              "bundles": [{"bundle": "tiny", "in_process": costs,
                           "server": [{**summarise_split([split_answer(4.0, 0.5, {
                               "queue": 0.1, "encode": 1.0, "search": 0.2, "rerank": 0.7, "total": 2.0})]),
                                       "errors": 0}]}]}
    text = split_markdown(report)
    assert "| tiny | 1 | 1 | 0 | p99 | 4.0 | 0.5 | 0.1 | 1.0 | 0.2 | 0.7 | 1.5 |" in text
    assert (f"| tiny | 2.0 | {costs['back_to_back']['encode']} / {costs['after_gap']['encode']} "
            f"({costs['ratio']['encode']}x) / {costs['after_spin']['encode']} ({costs['spin_ratio']['encode']}x) |"
            in text)
