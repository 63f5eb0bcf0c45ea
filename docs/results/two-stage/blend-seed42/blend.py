"""A per-list blend of a bench seed's MLP and LightGBM rankers, scored as `seqrec evaluate` scores a bundle.

    python docs/results/two-stage/blend-seed42/blend.py MLP_BUNDLE LGBM_BUNDLE PREPARED OUT.json

Both bundles come from one `seqrec bench two-stage` seed (same retriever, same mined groups). For each split the
candidates are retrieved once (the MLP bundle's system, compiled as the service runs it) and each ranker scores
them; the blend is w * f(MLP) + (1 - w) * f(LightGBM) with f a per-list z-score or the negated per-list rank
over the filled slots, so a user's blended scores do not depend on the batch. w = 1 is the MLP alone, w = 0
LightGBM alone (their bundles' own figures). Not a product path: a probe whether a blend is worth building.
"""

import json
import sys
from pathlib import Path

import torch

from common.metrics import ndcg_at
from offline.data.prepared import load_prepared
from offline.evaluation.two_stage import rerank_groups
from offline.jobs.evaluate import _retrieved, _system

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def zscore(s: torch.Tensor) -> torch.Tensor:
    filled = torch.isfinite(s)
    x = torch.where(filled, s, 0.0)
    n = filled.sum(1, keepdim=True).clamp(min=1)
    mean = x.sum(1, keepdim=True) / n
    var = torch.where(filled, (s - mean) ** 2, 0.0).sum(1, keepdim=True) / n
    return torch.where(filled, (s - mean) / var.sqrt().clamp(min=1e-9), -torch.inf)


def negrank(s: torch.Tensor) -> torch.Tensor:
    filled = torch.isfinite(s)
    order = torch.where(filled, s, -1e30).argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order, dtype=torch.float64)
    rank.scatter_(1, order, torch.arange(s.shape[1], dtype=torch.float64).expand_as(order).clone())
    return torch.where(filled, -rank, -torch.inf)


def main() -> None:
    mlp_bundle, lgbm_bundle, data_dir, out = map(Path, sys.argv[1:5])
    torch.set_num_threads(1)
    data = load_prepared(data_dir)
    mlp, lgbm = _system(mlp_bundle, data, "two-stage", None), _system(lgbm_bundle, data, "two-stage", None)
    assert mlp.ranker is not None
    assert lgbm.ranker is not None
    result: dict[str, dict[str, float]] = {}
    for split, groups in _retrieved(mlp, data, ("valid", "test")).items():
        for name, f in (("zscore", zscore), ("rank", negrank)):
            for w in WEIGHTS:
                def blended(batch, w=w, f=f):  # type: ignore[no-untyped-def]
                    a, b = mlp.ranker.ranker.score(batch).double(), lgbm.ranker.ranker.score(batch).double()
                    return a if w == 1 else b if w == 0 else w * f(a) + (1 - w) * f(b)
                ranks = rerank_groups(blended, mlp.source, groups, data.n_items, k=1).ranks
                result.setdefault(f"{name} w_mlp={w}", {})[f"{split} NDCG@10"] = round(ndcg_at(ranks), 6)
    out.write_text(json.dumps({"mlp": str(mlp_bundle), "lgbm": str(lgbm_bundle), "data": str(data_dir),
                               "ndcg@10": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
