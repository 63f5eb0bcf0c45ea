"""`python -m offline.bench.quality.cold_start`: how well items added without retraining are recommended.

    split     hold out a share of the catalogue (offline/data/derive.py: every interaction of those
              items removed from every sequence) -> OUT/train (prepared) + OUT/held_out_items.parquet
    evaluate  load the retriever trained on OUT/train, add the held-out items through the same code
              as ``POST /admin/items`` (service/system/catalog.py), and rank the full extended catalogue for
              every test user of the original data whose test target is a held-out item

Train between the two with the dataset's committed config, e.g.
``seqrec train --config configs/beauty/transformer.yaml --data OUT/train --out OUT/retriever --threads 1``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.cli.common import SEED, configure_logging
from offline.data.derive import HELD_OUT, hold_out_items
from offline.data.prepared import PreparedDataset, load_prepared
from offline.data.sequences import Sequences
from offline.evaluation.evaluate import summarize, target_ranks
from offline.tables import markdown_table
from retriever.model import Retriever
from service.system.bundle import Bundle
from service.system.catalog import CatalogChanges, apply_changes
from service.system.loader import load_bundle

KS = (1, 5, 10, 20, 50)

log = logging.getLogger(__name__)


def split_main(args: argparse.Namespace) -> int:
    record = hold_out_items(load_prepared(args.data), Path(args.out), args.share, args.seed)
    print(json.dumps(record, indent=2))
    return 0


def evaluate_main(args: argparse.Namespace) -> int:
    data, split_dir, out = load_prepared(args.data), Path(args.split), Path(args.out)
    held = pq.read_table(split_dir / HELD_OUT)
    base = load_bundle(Path(args.artifact))
    added = [{k: v for k, v in row.items() if v is not None} for row in held.to_pylist()]
    bundle = apply_changes(base, CatalogChanges(added=added))  # what POST /admin/items does
    inputs, targets, users = cold_users(data, bundle, set(held.column("item_id").to_pylist()))
    n = bundle.n_items
    log.info("%d held-out items, %d got vectors; %d test users have one as their target", len(added),
             n - base.n_items, len(users))
    counts = torch.from_numpy(bundle.popularity).float()
    scorers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "item features (POST /admin/items)": bundle.artifact.model.score,
        "random vector": randomised(bundle, base.n_items, args.seed).score,
        "popularity": lambda h: counts.expand(len(h), -1).clone().index_fill_(1, torch.tensor([0]), -torch.inf),
    }
    rows: list[list[str]] = []
    record: dict[str, Any] = {"command": command(args), "artifact": str(args.artifact), "split": str(split_dir),
                        "held_out_items": len(added), "items_with_vectors": n - base.n_items,
                        "test_users": len(users), "catalogue_items": n,
                        "model_metrics_on_trained_items": base.artifact.manifest.metrics, "results": {}}
    for name, scorer in scorers.items():
        ranks = np.full(len(users), n + 1, dtype=np.int64)  # a target with no vector is a miss
        known = targets > 0
        ranks[known] = target_ranks(scorer, inputs.take(np.flatnonzero(known)), targets[known], n,
                                    max_len=bundle.max_len, exclude_seen=bundle.exclude_seen, desc=name)
        metrics = summarize(ranks, KS)
        record["results"][name] = metrics
        rows.append([name, *(f"{metrics[m]:.4f}" for m in ("HR@10", "NDCG@10", "HR@50", "NDCG@50"))])
    record["other_test_users"] = side_effects(data, base, bundle, set(held.column("item_id").to_pylist()),
                                              args.sample, args.seed)
    write_results(out, record, rows)
    return 0


def side_effects(data: PreparedDataset, base: Bundle, bundle: Bundle, held: set[str], sample: int,
                 seed: int) -> dict[str, Any]:
    """For a sample of the other test users (target a trained item): NDCG@10 before and after the additions,
    and the share of their top-10 slots the added items take (they are 5% of the catalogue)."""
    out: dict[str, Any] = {}
    rows: np.ndarray | None = None
    for name, served in (("before", base), ("after", bundle)):
        inputs, targets, users = cold_users(data, served, held, cold=False)  # the same users both times
        if rows is None:
            rows = np.sort(np.random.default_rng(seed).choice(len(users), size=min(sample, len(users)),
                                                              replace=False))
        inputs, targets = inputs.take(rows), targets[rows]
        ranks = target_ranks(served.artifact.model.score, inputs, targets, served.n_items, max_len=served.max_len,
                             exclude_seen=served.exclude_seen, desc=f"other users, {name}")
        out[name] = {"users": len(rows), **summarize(ranks, (10,))}
        if name == "after":
            out["added_share_of_top10"] = round(added_share(served, inputs, base.n_items), 4)
    out["added_share_of_catalogue"] = round(1 - base.n_items / bundle.n_items, 4)
    return out


def added_share(bundle: Bundle, inputs: Sequences, n_trained: int, k: int = 10,
                scorer: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """The share of the top-``k`` slots (history excluded) that items past ``n_trained`` take."""
    score = scorer or bundle.artifact.model.score
    taken = total = 0
    with torch.inference_mode():
        for start in range(0, len(inputs), 512):
            history = torch.from_numpy(inputs.padded(np.arange(start, min(start + 512, len(inputs)))))
            scores = score(history[:, -bundle.max_len :])
            scores.scatter_(1, history, -torch.inf)
            top = scores.topk(k, dim=1).indices
            taken += int((top > n_trained).sum())
            total += top.numel()
    return taken / max(total, 1)


def command(args: argparse.Namespace) -> str:
    return (f"python -m offline.bench.quality.cold_start evaluate --data {args.data} --split {args.split} "
            f"--artifact {args.artifact} --out {args.out} --seed {args.seed} --sample {args.sample}")


def cold_users(data: PreparedDataset, bundle: Bundle, held: set[str], *, cold: bool = True, position: int = -1
               ) -> tuple[Sequences, np.ndarray, np.ndarray]:
    """The users of the original data whose test target (``position`` -1; -2: validation target) is a held-out
    item (``cold``; else the others): their histories (everything before it, in ``bundle``'s ids; items it lacks
    dropped) and targets (0 when it has no vector)."""
    seqs = data.sequences
    at = seqs.items[seqs.offsets[1:] + position]  # every prepared user has at least 3 items
    users = np.flatnonzero(np.isin(data.item_ids[at].astype(str), list(held)) == cold)
    lookup = np.array([bundle.index_of.get(str(i), 0) for i in data.item_ids], dtype=np.int64)
    lookup[0] = 0
    histories, targets = [], np.zeros(len(users), dtype=np.int64)
    for j, u in enumerate(users):
        row = lookup[seqs.items[seqs.offsets[u] : seqs.offsets[u + 1] + position + 1]]
        histories.append([int(i) for i in row[:-1] if i > 0])
        targets[j] = row[-1]
    return Sequences.from_lists(histories), targets, users


def randomised(bundle: Bundle, n_trained: int, seed: int) -> Retriever:
    """A copy of the bundle's model whose added items have random vectors (ID rows drawn with the spread of
    the trained ID rows, no features) instead of their feature means: the baseline the features must beat."""
    import copy

    model = copy.deepcopy(bundle.artifact.model)
    encoder: Any = model.encoder  # a backbone with item features (the only kind that takes new items)
    with torch.no_grad():
        table = encoder.item_emb.weight
        std = float(table[1 : n_trained + 1].std())
        generator = torch.Generator().manual_seed(seed)
        table[n_trained + 1 :] = torch.randn(table[n_trained + 1 :].shape, generator=generator) * std
        encoder.item_features[n_trained + 1 :] = 0
    return model


def write_results(out: Path, record: dict[str, Any], rows: list[list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))
    table = markdown_table(["new items get", "HR@10", "NDCG@10", "HR@50", "NDCG@50"], rows)
    text = (f"# Cold start: items added without retraining\n\n{table}\n\n"
            f"{record['test_users']} test users whose target is one of {record['held_out_items']} held-out items "
            f"({record['items_with_vectors']} with at least one known attribute value), ranked among all "
            f"{record['catalogue_items']} items.{_side_line(record['other_test_users'])} "
            f"Reproduce: `{record['command']}`\n")
    atomic_write(out / "results.md", lambda p: p.write_text(text))


def _side_line(side: dict[str, Any]) -> str:
    before, after = side["before"], side["after"]
    return (f" For {after['users']} other test users (a trained item as target), NDCG@10 {before['NDCG@10']:.4f} "
            f"before the additions and {after['NDCG@10']:.4f} after; the added items take "
            f"{side['added_share_of_top10']:.1%} of their top-10 slots (they are "
            f"{side['added_share_of_catalogue']:.1%} of the catalogue).")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m offline.bench.quality.cold_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="hold out a share of the items")
    s.add_argument("--data", required=True, help="prepared folder")
    s.add_argument("--out", required=True, help="folder for train/ and held_out_items.parquet")
    s.add_argument("--share", type=float, default=0.05)
    s.add_argument("--seed", type=SEED, default=42)
    s.set_defaults(handler=split_main)
    e = sub.add_parser("evaluate", help="add the held-out items to a trained bundle and rank them")
    e.add_argument("--data", required=True, help="the original prepared folder")
    e.add_argument("--split", required=True, help="the folder `split` wrote")
    e.add_argument("--artifact", required=True, help="a bundle trained on SPLIT/train")
    e.add_argument("--out", required=True, help="results folder (results.json, results.md)")
    e.add_argument("--seed", type=SEED, default=0, help="seed of the random-vector baseline and the user sample")
    e.add_argument("--sample", type=int, default=3000, help="other test users checked for side effects")
    e.set_defaults(handler=evaluate_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging(logging.INFO)
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SeqrecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
