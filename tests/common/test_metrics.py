"""common/metrics.py: the one HR/NDCG/MRR/Recall from ranks, against the three implementations it replaced.

Before it, `seqrec evaluate` and training took the mean in torch float64 (rounded to 6 digits), the ranker's
`ndcg_at` and the breakdown tables in numpy float64. The per-user values of the two agree bit for bit; their
means may differ in the last bit (torch and numpy sum in other orders), so every caller now takes numpy's, and
these tests pin that each caller's numbers are the digits it reported before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.metrics import mean_metrics, metrics_from_ranks, ndcg_at
from offline.evaluation.breakdown import group_metrics
from offline.evaluation.evaluate import summarize

KS = (1, 5, 10, 20, 50)


def _torch_summary(ranks: np.ndarray, ks: tuple[int, ...]) -> dict[str, float]:
    """The summary `seqrec evaluate` wrote before: offline/evaluation/metrics.py's torch values and mean."""
    r = torch.from_numpy(ranks).to(torch.float64)
    out = {}
    for k in ks:
        hit = (r <= k).to(torch.float64)
        for name, values in (("HR", hit), ("NDCG", hit / torch.log2(r + 1.0)), ("MRR", hit / r), ("Recall", hit)):
            out[f"{name}@{k}"] = round(float(values.mean()), 6)
    return out


def _numpy_ndcg(ranks: np.ndarray, k: int) -> float:
    """ranker/train.py's `ndcg_at` before (also the breakdown tables' NDCG line)."""
    gains = np.where(ranks <= k, 1.0 / np.log2(ranks + 1.0), 0.0)
    return float(gains.mean()) if len(ranks) else 0.0


def _rank_samples(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(63)
    samples = []
    for i in range(n):
        users, catalogue = int(rng.integers(1, 50_000)), int(rng.integers(2, 20_000))
        ranks = rng.integers(1, catalogue + 1, size=users)
        if i % 2:  # most targets near the top, as for a trained model
            ranks = np.minimum(ranks, rng.geometric(0.15, size=users))
        samples.append(ranks.astype(np.int64))
    return samples


def test_metric_values_by_hand() -> None:
    values = metrics_from_ranks(np.array([1, 3, 11]), ks=(10,))
    assert values["HR@10"].tolist() == [1.0, 1.0, 0.0]
    assert values["Recall@10"].tolist() == [1.0, 1.0, 0.0]
    assert values["NDCG@10"].tolist() == pytest.approx([1.0, 1 / math.log2(4), 0.0])
    assert values["MRR@10"].tolist() == pytest.approx([1.0, 1 / 3, 0.0])
    assert mean_metrics(np.array([1, 3]), (1,)) == {"HR@1": 0.5, "NDCG@1": 0.5, "MRR@1": 0.5, "Recall@1": 0.5}


def test_no_users() -> None:
    assert ndcg_at(np.array([], dtype=np.int64)) == 0.0
    assert all(math.isnan(v) for v in mean_metrics(np.array([], dtype=np.int64)).values())


@pytest.mark.parametrize("ranks", _rank_samples(40))
def test_every_caller_reports_the_digits_it_did(ranks: np.ndarray) -> None:
    r = torch.from_numpy(ranks).to(torch.float64)
    for k in KS:  # the per-user values: bit for bit what the torch implementation computed
        values = metrics_from_ranks(ranks, (k,))
        hit = (r <= k).to(torch.float64)
        assert np.array_equal(values[f"NDCG@{k}"], (hit / torch.log2(r + 1.0)).numpy())
        assert np.array_equal(values[f"MRR@{k}"], (hit / r).numpy())
        assert ndcg_at(ranks, k) == _numpy_ndcg(ranks, k)  # ranker early stopping and selection: unrounded
    assert summarize(ranks, KS) == _torch_summary(ranks, KS)  # evaluation, training, tuning
    rows = group_metrics(ranks, np.arange(len(ranks)) % 2, ["even", "odd"], k=10)
    for g, row in enumerate(rows):
        assert row["NDCG@10"] == round(_numpy_ndcg(ranks[g::2], 10), 6)
        assert row["HR@10"] == round(float((ranks[g::2] <= 10).mean()), 6)
