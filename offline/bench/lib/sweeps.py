"""Offered rates stepped up until the service misses its target: the highest rate it holds.

Every step is one `offline.bench.lib.load.run_load`; a step passes with no error and p99 at most
``P99_TARGET_MS`` (50 ms). Used by `seqrec bench serve`, the replicas bench and the soak.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import SeqrecError
from offline.bench.lib.load import P99_TARGET_MS, LoadResult, run_load
from offline.tables import markdown_table

log = logging.getLogger(__name__)


def sweep(url: str, payloads: Sequence[dict[str, Any]], rates: Sequence[float], duration_s: float,
          warmup_s: float = 1.0, seed: int = 0, *, stop_on_failure: bool = False,
          p99_ms: float = P99_TARGET_MS, **options: Any) -> list[LoadResult]:
    """run_load at each rate in turn (ascending); with stop_on_failure, up to the first that fails
    the p99 / zero-error target. ``options`` go to run_load (arrivals, timeout_s, label, ...)."""
    results: list[LoadResult] = []
    for rate in sorted(rates):
        result = run_load(url, payloads, rate, duration_s, warmup_s, seed, **options)
        log.info("%s %7.1f r/s: ok %d/%d, p50 %.2f ms, p99 %.2f ms, errors %s, client cpu %.2f",
                 result.label or url, rate, result.ok, result.sent, result.p50_ms, result.p99_ms,
                 result.error_kinds or 0, result.client_cpu)
        results.append(result)
        if stop_on_failure and not result.passes(p99_ms):
            break
    return results


def geometric_rates(start: float, stop: float, factor: float = 1.5) -> list[float]:
    """start, start*factor, ... up to stop (rounded to whole requests/s)."""
    if start <= 0 or stop < start or factor <= 1:
        raise SeqrecError(f"rates {start:g}..{stop:g} x{factor:g}: need 0 < start <= stop and factor > 1")
    rates: list[float] = []
    rate = start
    while rate <= stop * (1 + 1e-9):
        rates.append(float(round(rate)))
        rate *= factor
    return sorted(set(rates))


@dataclass(frozen=True)
class Sustained:
    """The highest offered rate that met the target (None if none did), and every run on the way."""

    rate: float | None
    results: list[LoadResult]


def max_sustained_rate(url: str, payloads: Sequence[dict[str, Any]], rates: Sequence[float], duration_s: float,
                       warmup_s: float = 1.0, seed: int = 0, *, p99_ms: float = P99_TARGET_MS,
                       **options: Any) -> Sustained:
    """Step up through ``rates`` until one fails (p99 > p99_ms or any error); the last that passed wins."""
    results = sweep(url, payloads, rates, duration_s, warmup_s, seed, stop_on_failure=True, p99_ms=p99_ms,
                    **options)
    passed = [result.rate for result in results if result.passes(p99_ms)]
    return Sustained(max(passed) if passed else None, results)


def parse_rates(text: str, flag: str = "--rates") -> list[float]:
    """``"50,100"`` -> ascending distinct positive rates."""
    try:
        rates = sorted({float(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise SeqrecError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not rates or min(rates) <= 0 or not all(math.isfinite(r) for r in rates):
        raise SeqrecError(f"{flag} must be positive numbers, got {text!r}")
    return rates


def report_table(results: Sequence[LoadResult]) -> str:
    """Markdown: one row per run."""
    has_labels = any(result.label for result in results)
    head = ["rate r/s", "sent", "ok", "errors", "throughput r/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
            "client CPU"]
    rows = []
    for result in results:
        errors = str(result.errors)
        if result.error_kinds:
            errors += " (" + ", ".join(f"{kind}: {count}" for kind, count in result.error_kinds.items()) + ")"
        row = [f"{result.rate:g}", str(result.sent), str(result.ok), errors, f"{result.throughput:.1f}",
               f"{result.p50_ms:.2f}", f"{result.p95_ms:.2f}", f"{result.p99_ms:.2f}", f"{result.max_ms:.2f}",
               f"{result.client_cpu:.2f}"]
        rows.append([result.label, *row] if has_labels else row)
    return markdown_table(["target", *head] if has_labels else head, rows) + "\n"
