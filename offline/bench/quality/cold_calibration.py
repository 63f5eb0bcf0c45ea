"""`python -m offline.bench.quality.cold_calibration`: choose the ID part items added without retraining get.

An added item's vector is its feature embeddings' mean plus ``model.added_id_weight`` times the mean ID row of
the trained items sharing its feature values (`service.system.catalog.added_id_rows`, what ``POST /admin/items``
runs). With no ID part (weight 0) the new items crowd other users' top 10s; a large weight buries them. This
bench, on the split and retriever of `offline.bench.quality.cold_start`:

1. for every weight of ``--weights``, on *validation* (the original data's second-to-last item as target, the
   history before it): NDCG@10 of the users whose validation target is a held-out item ("cold"), and the share
   of the top-10 slots the added items take for a sample of the other users ("exposure");
2. chooses the weight with the best cold NDCG@10 among those whose exposure is at most ``--exposure-bar``
   times the added items' share of the catalogue (none: the least exposed), fixed before any run;
3. reports the chosen weight and the baseline (weight 0) on *test* (the last item), the same two figures and
   the other users' NDCG@10 before the additions and after.

``--offsets`` also measures, on validation only, the other family the issue names: weight-0 vectors with a score
offset subtracted from every added item. It is not served (the FAISS index ranks unit vectors by inner product,
which a per-item offset does not fit), so it is never chosen: it says whether it would be worth building.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.quality.cold_start import added_share, cold_users
from offline.cli.common import SEED, configure_logging
from offline.data.derive import HELD_OUT
from offline.data.prepared import PreparedDataset, load_prepared
from offline.evaluation.evaluate import Scorer, summarize, target_ranks
from offline.tables import markdown_table
from service.system.bundle import Bundle
from service.system.catalog import CatalogChanges, apply_changes
from service.system.loader import load_bundle

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
POSITIONS = {"valid": -2, "test": -1}

log = logging.getLogger(__name__)


class Setup:
    """The original data, the trained bundle, the held-out items as ``POST /admin/items`` rows, the sample of
    other users per split (the same users for every weight)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.data: PreparedDataset = load_prepared(args.data)
        held = pq.read_table(Path(args.split) / HELD_OUT)
        self.added = [{k: v for k, v in row.items() if v is not None} for row in held.to_pylist()]
        self.held = {str(i) for i in held.column("item_id").to_pylist()}
        self.base: Bundle = load_bundle(Path(args.artifact))
        self.sample, self.seed = args.sample, args.seed

    def sample_rows(self, n_users: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.sort(rng.choice(n_users, size=min(self.sample, n_users), replace=False))


def point(setup: Setup, bundle: Bundle, split: str, scorer: Scorer | None = None) -> dict[str, Any]:
    """Cold users' metrics and the other users' NDCG@10 and exposure on ``split`` with ``bundle``'s vectors
    (scored by ``scorer``, else the bundle's model)."""
    score = scorer or bundle.artifact.model.score
    inputs, targets, users = cold_users(setup.data, bundle, setup.held, position=POSITIONS[split])
    ranks = np.full(len(users), bundle.n_items + 1, dtype=np.int64)  # a target with no vector is a miss
    known = targets > 0
    ranks[known] = _ranks(bundle, score, inputs.take(np.flatnonzero(known)), targets[known], f"{split} cold")
    out: dict[str, Any] = {"cold_users": len(users), "cold": summarize(ranks, (10, 50))}
    inputs, targets, _ = cold_users(setup.data, bundle, setup.held, cold=False, position=POSITIONS[split])
    rows = setup.sample_rows(len(targets))
    inputs, targets = inputs.take(rows), targets[rows]
    out["other_users"] = len(rows)
    out["other_NDCG@10"] = summarize(_ranks(bundle, score, inputs, targets, f"{split} others"), (10,))["NDCG@10"]
    if bundle.n_items > setup.base.n_items:
        out["added_share_of_top10"] = round(added_share(bundle, inputs, setup.base.n_items, scorer=score), 4)
    return out


def _ranks(bundle: Bundle, scorer: Scorer, inputs: Any, targets: np.ndarray, desc: str) -> np.ndarray:
    return target_ranks(scorer, inputs, targets, bundle.n_items, max_len=bundle.max_len,
                        exclude_seen=bundle.exclude_seen, desc=desc)


def offset_scorer(bundle: Bundle, n_trained: int, offset: float) -> Scorer:
    """The bundle's scores with ``offset`` subtracted from every added item's (measured only, not served)."""
    shift = torch.zeros(bundle.n_items + 1)
    shift[n_trained + 1 :] = offset
    return lambda history: bundle.artifact.model.score(history) - shift


def choose(frontier: list[dict[str, Any]], bar: float) -> dict[str, Any]:
    """The best cold NDCG@10 among the points within the exposure bar; none within it: the least exposed."""
    within = [p for p in frontier if p["added_share_of_top10"] <= bar]
    if within:
        return max(within, key=lambda p: (p["cold"]["NDCG@10"], -p["id_weight"]))
    return min(frontier, key=lambda p: p["added_share_of_top10"])


def calibrate_main(args: argparse.Namespace) -> int:
    setup = Setup(args)
    changes = CatalogChanges(added=setup.added)
    share = 0.0
    frontier: list[dict[str, Any]] = []
    for weight in args.weights:
        bundle = apply_changes(setup.base, changes, id_weight=weight)  # what POST /admin/items does
        share = 1 - setup.base.n_items / bundle.n_items
        frontier.append({"id_weight": weight, **point(setup, bundle, "valid")})
        log.info("weight %g: %s", weight, json.dumps(frontier[-1]))
    bar = round(args.exposure_bar * share, 4)
    chosen = choose(frontier, bar)
    plain = apply_changes(setup.base, changes, id_weight=0.0)
    offsets = [{"offset": offset, **point(setup, plain, "valid", offset_scorer(plain, setup.base.n_items, offset))}
               for offset in args.offsets]
    test = {"before the additions": point(setup, setup.base, "test")}
    for name, weight in (("baseline (weight 0)", 0.0), (f"chosen (weight {chosen['id_weight']:g})",
                                                        chosen["id_weight"])):
        test[name] = {"id_weight": weight, **point(setup, apply_changes(setup.base, changes, id_weight=weight),
                                                    "test")}
    record = {"command": command(args), "artifact": str(args.artifact), "split": str(args.split),
              "held_out_items": len(setup.added), "added_share_of_catalogue": round(share, 4),
              "exposure_bar": bar,
              "model_metrics_on_trained_items": setup.base.artifact.manifest.metrics,
              "valid_frontier": frontier, "chosen_id_weight": chosen["id_weight"], "test": test,
              "valid_offsets_not_served": offsets}
    write_results(Path(args.out), record)
    return 0


def command(args: argparse.Namespace) -> str:
    weights = " ".join(f"{w:g}" for w in args.weights)
    return (f"python -m offline.bench.quality.cold_calibration --data {args.data} --split {args.split} "
            f"--artifact {args.artifact} --out {args.out} --weights {weights} --exposure-bar {args.exposure_bar:g} "
            f"--sample {args.sample} --seed {args.seed}"
            + (" --offsets " + " ".join(f"{o:g}" for o in args.offsets) if args.offsets else ""))


def write_results(out: Path, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))
    head = ["ID weight", "cold HR@10", "cold NDCG@10", "cold NDCG@50", "added share of others' top 10",
            "others' NDCG@10"]
    valid = markdown_table(head, [_row(f"{p['id_weight']:g}", p) for p in record["valid_frontier"]])
    test = markdown_table(["on test", *head[1:]], [_row(name, p) for name, p in record["test"].items()])
    first = record["valid_frontier"][0]
    offsets = record["valid_offsets_not_served"]
    extra = "" if not offsets else (
        "\n\n## Validation: weight 0 with a score offset for added items (measured, not served)\n\n"
        + markdown_table(["offset", *head[1:]], [_row(f"{p['offset']:g}", p) for p in offsets]))
    text = (f"# Calibrating the ID part of items added without retraining\n\n## Validation (choice)\n\n{valid}\n\n"
            f"{first['cold_users']} validation users whose validation target is one of {record['held_out_items']} "
            f"held-out items; {first['other_users']} other validation users sampled. Rule: the best cold NDCG@10 "
            f"with the added items' share of the others' top 10 at most {record['exposure_bar']:.1%} "
            f"(they are {record['added_share_of_catalogue']:.1%} of the catalogue). Chosen: "
            f"{record['chosen_id_weight']:g}.{extra}\n\n## Test\n\n{test}\n\nReproduce: `{record['command']}`\n")
    atomic_write(out / "results.md", lambda p: p.write_text(text))


def _row(name: str, p: dict[str, Any]) -> list[str]:
    share = p.get("added_share_of_top10")
    return [name, f"{p['cold']['HR@10']:.4f}", f"{p['cold']['NDCG@10']:.4f}", f"{p['cold']['NDCG@50']:.4f}",
            "-" if share is None else f"{share:.1%}", f"{p['other_NDCG@10']:.4f}"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m offline.bench.quality.cold_calibration", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the original prepared folder")
    p.add_argument("--split", required=True, help="the folder `cold_start split` wrote")
    p.add_argument("--artifact", required=True, help="a bundle trained on SPLIT/train")
    p.add_argument("--out", required=True, help="results folder (results.json, results.md)")
    p.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS), help="ID weights tried on validation")
    p.add_argument("--offsets", type=float, nargs="*", default=[],
                   help="score offsets for weight-0 added items, measured on validation only (not served)")
    p.add_argument("--exposure-bar", type=float, default=1.5,
                   help="most share of other users' top 10 the added items may take, per their catalogue share")
    p.add_argument("--sample", type=int, default=3000, help="other users checked for exposure, per split")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the user sample")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging(logging.INFO)
    args = parser().parse_args(argv)
    if any(w < 0 for w in args.weights) or any(o < 0 for o in args.offsets) or args.exposure_bar <= 0 \
            or args.sample < 1:
        print("error: --weights and --offsets must be >= 0, --exposure-bar > 0 and --sample >= 1", file=sys.stderr)
        return 2
    try:
        return int(calibrate_main(args))
    except SeqrecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
