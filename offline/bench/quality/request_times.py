"""How a ranker with request-time features scores requests that carry less than the evaluation's times.

    python -m offline.bench.quality.request_times --artifact BUNDLE --data PREPARED \
        --out docs/results/request-times/ml-100k

`seqrec evaluate` scores each validation and test prediction as of its target's timestamp, with the time of the
user's newest interaction (what `seqrec bench parity` sends as `at` and `last_event_at`). A client may send
less: `history` without `last_event_at` (user_idle_days is then -1, a value the ranker never saw in training), or
no `at` (the service's clock, years after the interactions of a public dataset). This bench re-scores the same
candidates and features with (a) the evaluation's times, (b) the newest interaction's time unknown, (c) every
request made at one moment, the clock when the bench runs (the default request's `at` and that of `seqrec
recommend` batch lists), and (d) every request at the data's newest timestamp (a batch job run right after the
data ends). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.data.prepared import load_prepared
from offline.evaluation.evaluate import summarize
from offline.jobs.evaluate import reranked_ranks, retrieved_groups
from offline.jobs.tables import has_clock
from offline.tables import markdown_table
from ranker.train import Groups

VARIANTS = {
    "as evaluated (target's time, newest interaction's time)": "evaluated",
    "newest interaction's time unknown (no last_event_at)": "no_last_event",
    "at = the clock when the bench ran (no at)": "now",
    "at = the data's newest timestamp": "data_end",
}


def _variant(groups: Groups, kind: str, now: float, data_end: float) -> Groups:
    assert groups.at is not None
    assert groups.last_event is not None
    if kind == "no_last_event":
        return dataclasses.replace(groups, last_event=np.full(len(groups), np.nan))
    if kind in ("now", "data_end"):
        return dataclasses.replace(groups, at=np.full(len(groups), now if kind == "now" else data_end))
    return groups


def run(bundle: Path, data_path: Path) -> dict[str, Any]:
    data = load_prepared(data_path)
    if not has_clock(data):
        raise SeqrecError(f"{data_path} has no timestamps (only an order): no request-time feature applies")
    now = time.time()
    times = data.sequences.timestamps
    assert times is not None
    data_end = float(np.max(times))
    system, groups = retrieved_groups(bundle, data, ("valid", "test"))
    if system.ranker is None or not system.ranker.needs_time:
        raise SeqrecError(f"{bundle}: its ranker reads no request-time feature")
    assert system.ranker.extras is not None
    rows = []
    for label, kind in VARIANTS.items():
        row: dict[str, Any] = {"variant": label}
        for name, g in groups.items():
            ranks = reranked_ranks(system, _variant(g, kind, now, data_end))
            row[name] = summarize(ranks, (10,))["NDCG@10"]
        rows.append(row)
    return {"artifact": str(bundle), "data": str(data_path), "clock": now, "data_end": data_end,
            "features": list(system.ranker.extras.names), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, required=True,
                        help="a bundle whose ranker reads request-time features")
    parser.add_argument("--data", type=Path, required=True, help="the prepared dataset it was trained on")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    result = run(args.artifact, args.data)
    table = markdown_table(["requests carry", "valid NDCG@10", "test NDCG@10"],
                           [[r["variant"], f"{r['valid']:.4f}", f"{r['test']:.4f}"] for r in result["rows"]])
    command = (f"python -m offline.bench.quality.request_times --artifact {args.artifact} --data {args.data} "
               f"--out {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = json.dumps({**result, "command": command}, indent=2) + "\n"
    text = (f"# Request-time features with less than the evaluation's times\n\n`{command}`\n\n"
            f"Ranker features: {', '.join(result['features'])}.\n\n{table}\n")
    atomic_write(args.out.with_suffix(".json"), lambda f: f.write_text(record))
    atomic_write(args.out.with_suffix(".md"), lambda f: f.write_text(text))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
