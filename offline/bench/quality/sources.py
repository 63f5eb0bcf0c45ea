"""Recall of each candidate source and of their union, on validation and test.

    python -m offline.bench.quality.sources --artifact BUNDLE --data PREPARED --out docs/results/sources/ml-100k

For every validation and test target (the history before it, excluded under the bundle's repeat
policy, as `seqrec evaluate` retrieves): the share found in the retriever's top N (FAISS), in the
co-occurrence source's top N (`ranker.cooc`, built from training positions only), and in their union
of depth N as mining, evaluation and the service merge it (`ranker.cooc.union`) for each offered
share of the cooc source. The share is chosen on validation (the table marks it); test is reported
beside it, never used. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from common.atomic import atomic_write
from offline.data.prepared import PreparedDataset, load_prepared
from offline.evaluation.retriever import check_catalogue
from offline.jobs.mine import merge_groups, mine
from offline.jobs.rank import split_sources
from offline.jobs.tables import cooc_table
from offline.tables import markdown_table
from ranker.artifact import unit_item_vectors
from ranker.cooc import CoocTable, cooc_top, recent_items
from ranker.mining import Mined
from ranker.train import Groups, make_groups
from retriever.artifact import RetrieverArtifact, load_artifact, retrieval_rows
from service.system.loader import served_encoder
from service.system.retrieve import excluded

DEPTHS = (100, 200)
SHARES = (0.1, 0.25, 0.5)


def _recall(candidates: np.ndarray, target: np.ndarray) -> float:
    return float((candidates == target[:, None]).any(1).mean()) if len(target) else 0.0


def _cooc_lists(groups: Groups, items: np.ndarray, table: CoocTable, depth: int, exclude_seen: bool,
                batch_size: int = 1024) -> np.ndarray:
    """(G, depth) the co-occurrence source's list for every group, alone."""
    mined = groups.mined
    out = np.zeros((len(groups), depth), dtype=np.int64)
    for lo in tqdm(range(0, len(groups), batch_size), desc="cooc", unit="batch", disable=None, leave=False):
        rows = np.arange(lo, min(lo + batch_size, len(groups)))
        exclude = [excluded(items[s:e], exclude_seen=exclude_seen) for s, e in zip(mined.start[rows], mined.end[rows],
                                                                                   strict=True)]
        out[rows], _ = cooc_top(table, recent_items(groups.history[rows], table.last), exclude, depth)
    return out


def _truncated(groups: Groups, depth: int) -> Groups:
    m = groups.mined
    return Groups(Mined(m.start, m.end, m.target, m.candidates[:, :depth], m.scores[:, :depth], m.user), groups.history,
                  groups.user)


def split_recalls(artifact: RetrieverArtifact, data: PreparedDataset, depths: tuple[int, ...],
                  shares: tuple[float, ...]) -> dict[str, dict[str, float]]:
    """{split: {"retriever@N", "cooc@N", "union<share>@N": recall}} for validation and test."""
    split = data.split()
    table = cooc_table(data, split)
    vectors = retrieval_rows(artifact.model, unit_item_vectors(artifact.model.item_vectors().detach()))
    encode, sources = served_encoder(artifact, threads=torch.get_num_threads()), split_sources(split)
    exclude_seen = artifact.manifest.exclude_seen
    plans = {"valid": (split.train, split.valid_targets), "test": (split.inputs("test"), split.test_targets)}
    out: dict[str, dict[str, float]] = {}
    for name, (inputs, target) in plans.items():
        mined = mine(encode, artifact.index, inputs.items, inputs.offsets[:-1], inputs.offsets[1:], target,
                     depth=max(depths), max_len=artifact.max_len, exclude_seen=exclude_seen, desc=f"retrieve {name}")
        groups = make_groups(mined, sources[name], artifact.max_len)
        cooc = _cooc_lists(groups, sources[name], table, max(depths), exclude_seen)
        row: dict[str, float] = {}
        for depth in depths:
            row[f"retriever@{depth}"] = _recall(mined.candidates[:, :depth], target)
            row[f"cooc@{depth}"] = _recall(cooc[:, :depth], target)
            for share in shares:
                merged = merge_groups(_truncated(groups, depth), sources[name], table, share, vectors,
                                      exclude_seen=exclude_seen)
                row[f"union{share:g}@{depth}"] = _recall(merged.mined.candidates, target)
        out[name] = {k: round(v, 6) for k, v in row.items()}
    return out


def report(record: dict[str, Any], command: str) -> str:
    recalls, depths, shares = record["recall"], record["depths"], record["shares"]
    chosen = record["chosen_share"]
    names = ["retriever", "cooc", *[f"union{s:g}" for s in shares]]
    labels = {"retriever": "retriever (FAISS)", "cooc": "co-occurrence",
              **{f"union{s:g}": f"union, cooc share {s:g}" + (" (chosen on valid)" if s == chosen else "")
                 for s in shares}}
    head = ["source", *[f"{split} recall@{d}" for split in ("valid", "test") for d in depths]]
    rows = [[labels[n], *[f"{recalls[split][f'{n}@{d}']:.4f}" for split in ("valid", "test") for d in depths]]
            for n in names]
    return (f"Candidate recall of each source and of their union (the merged list of the same depth), "
            f"{record['data']}, retriever {record['version']}, repeats: {record['repeats']}. "
            f"Co-occurrence table from training positions only. Reproduce: `{command}`.\n\n"
            f"{markdown_table(head, rows)}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="retriever artifact or bundle")
    p.add_argument("--data", type=Path, required=True, help="prepared folder it was trained on")
    p.add_argument("--out", type=Path, required=True, help="results path without suffix: writes OUT.json, OUT.md")
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="comma-separated depths N")
    p.add_argument("--shares", default=",".join(map(str, SHARES)), help="comma-separated cooc shares of the union")
    args = p.parse_args(argv)
    depths = tuple(int(d) for d in args.depths.split(","))
    shares = tuple(float(s) for s in args.shares.split(","))
    data = load_prepared(args.data)
    artifact = load_artifact(args.artifact)
    check_catalogue(artifact, data)
    recalls = split_recalls(artifact, data, depths, shares)
    chosen = max(shares, key=lambda s: recalls["valid"][f"union{s:g}@{depths[0]}"])
    record = {"artifact": str(args.artifact), "data": str(args.data), "version": artifact.manifest.version,
              "repeats": artifact.manifest.repeats, "depths": list(depths), "shares": list(shares),
              "chosen_share": chosen, "chosen_on": f"valid recall@{depths[0]}", "recall": recalls}
    command = (f"python -m offline.bench.quality.sources --artifact {args.artifact} --data {args.data} "
               f"--out {args.out} --depths {args.depths} --shares {args.shares}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out.with_suffix(".json"), lambda f: f.write_text(json.dumps(record, indent=2) + "\n"))
    text = report(record, command)
    atomic_write(args.out.with_suffix(".md"), lambda f: f.write_text(text))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
