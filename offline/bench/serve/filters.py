"""`python -m offline.bench.serve.filters`: POST /recommend latency with business filters that keep 1 %, 10 % and
50 % of the catalogue, against the same requests unfiltered, over HTTP on one server.

A uvicorn server serves the bundle (one inference thread). The payloads are the test users' histories
(the first ``--users``); each filter is an any-of condition on the catalogue's list column (``attributes``
or ``genres``) built greedily from its values, most frequent first, to keep close to the target share
(the share it really keeps is reported), or ``year >= Y`` for a catalogue with years only. Each condition,
and the unfiltered reference, is offered at ``--rate`` requests/s by the open-loop client
(`offline.bench.lib.load`) for ``--duration`` seconds after a warm-up, in turn. Every answer of a filtered run is
checked: an item outside the filter, or a list shorter than k, counts as a violation.
Rows go to ``OUT/results.json`` (appended per label) and ``OUT/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from offline.bench.lib.load import run_load
from offline.bench.lib.processes import SERVICE_APP, start_server
from offline.data.prepared import load_prepared
from offline.tables import markdown_table
from service.system.bundle import Bundle
from service.system.loader import load_bundle, resolve_bundle

HEAD = ["label", "index", "filter", "kept share", "rate r/s", "ok / sent", "p50 ms", "p99 ms", "violations",
        "load avg before/after"]


def filter_for(bundle: Bundle, share: float) -> tuple[dict[str, Any], np.ndarray]:
    """A condition keeping close to ``share`` of the catalogue, and the rows it keeps."""
    lists = [c for c in ("attributes", "genres") if c in bundle.filters.values]
    if lists:
        column = lists[0]
        values = sorted(bundle.filters.values[column].items(), key=lambda kv: (-len(kv[1]), kv[0]))
        kept = np.zeros(bundle.n_items, dtype=bool)
        chosen: list[str] = []
        for value, rows in values:
            trial = kept.copy()
            trial[rows] = True
            if trial.mean() <= share * 1.1:
                kept, chosen = trial, [*chosen, value]
            if kept.mean() >= share * 0.95:
                break
        if not chosen:  # every value holds more than the share: the rarest one
            value, rows = values[-1]
            chosen, kept[rows] = [value], True
        return {column: chosen}, kept
    years = bundle.filters.numbers["year"]
    threshold = float(np.nanquantile(years, 1 - share))
    return {"year": {"gte": threshold}}, years >= threshold


def _violations(url: str, payloads: list[dict[str, Any]], kept: np.ndarray, bundle: Bundle, k: int) -> int:
    """Requests whose answer holds an item outside ``kept`` or fewer than k items while k eligible ones exist."""
    bad = 0
    with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
        for body in payloads[:100]:
            response = client.post("/recommend", json=body)
            response.raise_for_status()
            items = [i["item_id"] for i in response.json()["items"]]
            rows = [bundle.index_of[i] - 1 for i in items]
            seen = {bundle.index_of[i] - 1 for i in body["history"] if i in bundle.index_of}
            eligible = int(kept.sum()) - int(kept[list(seen)].sum()) if seen else int(kept.sum())
            bad += int(not kept[rows].all() or len(items) < min(k, eligible))
    return bad


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    bundle = load_bundle(resolve_bundle(args.bundle))
    data = load_prepared(args.data, verify=False)
    inputs = data.split().inputs("test")
    catalogue = data.item_ids
    histories = [catalogue[inputs.row(u)].tolist() for u in range(min(args.users, len(inputs)))]
    env = {"SEQREC_ARTIFACTS": str(Path(args.bundle).resolve()), "SEQREC_THREADS": "1", "SEQREC_REDIS_URL": ""}
    rows = []
    with start_server(SERVICE_APP, env, ready_timeout_s=120) as url:
        for share in [None, *args.shares]:
            spec, kept = (None, np.ones(bundle.n_items, dtype=bool)) if share is None else filter_for(bundle, share)
            payloads = [{"history": h, "k": args.k, **({"filters": spec} if spec else {})} for h in histories]
            before = os.getloadavg()[0]
            result = run_load(url, payloads, args.rate, args.duration, warmup_s=2.0, label=str(share))
            violations = _violations(url, payloads, kept, bundle, args.k) if spec else 0
            rows.append({**result.to_dict(), **_describe(bundle, spec, share, kept), "label": args.label,
                         "violations": violations, "load_before": round(before, 1),
                         "load_after": round(os.getloadavg()[0], 1), "k": args.k, "users": len(histories),
                         "bundle": str(args.bundle)})
    return rows


def _describe(bundle: Bundle, spec: dict[str, Any] | None, share: float | None, kept: np.ndarray) -> dict[str, Any]:
    text = "none" if spec is None else json.dumps(spec)
    return {"index": bundle.artifact.manifest.index.get("kind", "?"),
            "filter": text if len(text) <= 80 else text[:80] + "...", "target_share": share,
            "kept_share": round(float(kept.mean()), 4), "kept_items": int(kept.sum()),
            "model_version": bundle.version, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    file = out / "results.json"
    kept = json.loads(file.read_text()) if file.exists() else []
    kept = [r for r in kept if r["label"] != rows[0]["label"]] + rows
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=2) + "\n")
    os.replace(tmp, file)
    table = markdown_table(HEAD, [[r["label"], r["index"], r["filter"], f"{100 * r['kept_share']:.1f} %", r["rate"],
                                   f"{r['ok']} / {r['sent']}", r["p50_ms"], r["p99_ms"], r["violations"],
                                   f"{r['load_before']} / {r['load_after']}"] for r in kept])
    (out / "README.md").write_text(
        "# Business filters: POST /recommend latency by the share of the catalogue a filter keeps\n\n"
        "Written by `python -m offline.bench.serve.filters` (commands in `docs/results/filters/COMMANDS.md`): "
        "one uvicorn "
        "server, one inference thread, open-loop Poisson arrivals at the given rate, latencies from each request's "
        "due time; `none` is the same requests unfiltered, run in the same server just before. Violations: of the "
        "first 100 answers of each filtered run, those holding an item outside the filter or fewer than k items "
        "while k eligible ones exist. The 2-core machine was shared with other engineers' jobs (load average "
        "before / after each run).\n\n" + table + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m offline.bench.serve.filters", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="the prepared folder the bundle was trained on")
    p.add_argument("--label", required=True)
    p.add_argument("--shares", default="0.01,0.1,0.5", help="target shares of the catalogue to keep")
    p.add_argument("--rate", type=float, default=20.0, help="offered requests/s")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per filter")
    p.add_argument("--users", type=int, default=500)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("docs/results/filters"))
    args = p.parse_args(argv)
    args.shares = [float(s) for s in args.shares.split(",")]
    rows = run(args)
    write(args.out, rows)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
