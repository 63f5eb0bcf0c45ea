"""The second stage over mined groups: each target's rank and each user's top k, from one scoring pass.

`offline.jobs.evaluate.evaluate_bundle` summarises the ranks; `seqrec bench parity` compares the top k with
what the service returns. Both come from the scores and the order the service computes, by the same functions
(`service.system.rerank.rerank_scores` and `top_k`): best score first, ties in retrieval order, empty slots never.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from ranker.train import FeatureSource, Groups, Scorer, group_inputs, served_order_ranks
from service.system.rerank import rerank_scores, top_k


@dataclass(frozen=True)
class Reranked:
    ranks: np.ndarray  # (G,) the target's full-ranking rank (ties pessimistic); n_items + 1 when not retrieved
    top: np.ndarray  # (G, k) internal ids, best first; 0 where fewer than k were retrieved


def rerank_groups(scorer: Scorer | None, source: FeatureSource, groups: Groups, n_items: int, *, k: int,
                  mask_ids: bool = False, batch_size: int = 512, desc: str = "rerank") -> Reranked:
    """Score every group's candidates (``scorer`` None: keep the retrieval scores, the retriever alone).

    A target ranks 1 + the number of other candidates scoring at least as high, as
    `ranker.train.group_ranks` counts it; a target the retriever did not return is a miss.
    """
    mined = groups.mined
    label = mined.label
    ranks = np.full(len(groups), n_items + 1, dtype=np.int64)
    top = np.zeros((len(groups), k), dtype=np.int64)
    with torch.inference_mode():
        for lo in tqdm(range(0, len(groups), batch_size), desc=desc, unit="batch", disable=None, leave=False):
            rows = np.arange(lo, min(lo + batch_size, len(groups)))
            empty = torch.from_numpy(mined.candidates[rows] == 0)
            if scorer is None:
                scores = torch.from_numpy(mined.scores[rows]).double()
            else:
                mask = torch.ones(empty.shape, dtype=torch.bool) if mask_ids else None
                history, user, candidates, retrieval, at, last_event = group_inputs(groups, rows)
                scores = rerank_scores(scorer, source.tables, source.item_vectors, history, user, candidates,
                                       retrieval, extras=source.extras, at=at, last_event=last_event,
                                       id_mask=mask).double()
            scores = scores.masked_fill(empty, -torch.inf)
            hit = label[rows] >= 0
            ranks[rows[hit]] = served_order_ranks(scores, torch.from_numpy(mined.scores[rows]).double(),
                                                torch.from_numpy(np.maximum(label[rows], 0)))[hit]
            for i, row, ids in zip(rows, scores.numpy(), mined.candidates[rows], strict=True):
                order = top_k(row, ids, k)
                top[i, : len(order)] = ids[order]
    return Reranked(ranks, top)

