"""An IVF index that probes one list still serves k items: `retriever.index.search` searches a short query again
over every list, so an unfiltered request gets what a filtered one gets (whose exact fallback always did)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from retriever.artifact import rewrite_index
from retriever.index import IndexSpec
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch


def test_every_request_gets_k_items_through_a_one_list_probe(bundle: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(bundle, tmp_path / "ivf"))
    rewrite_index(copy, IndexSpec(kind="ivf", nlist=8, nprobe=1))
    served = load_bundle(copy, inference="eager")
    n = served.n_items
    histories = [[1 + (7 * u + j) % n for j in range(1 + u % 4)] for u in range(12)]
    plain = [Query(h, k=n - len(h), candidates=n - len(h), rerank=False) for h in histories]
    everything = np.ones(n, dtype=bool)  # an allow-list of every item: the filtered path
    filtered = [Query(h, k=n - len(h), candidates=n - len(h), rerank=False, allowed=everything) for h in histories]
    for query, got, same in zip(plain, recommend_batch(served, plain), recommend_batch(served, filtered), strict=True):
        items = [i for i, _, _ in got.items]
        assert len(items) == query.k  # every item but the history's: a probe of 1 of 8 lists returned about 1/8
        assert set(items) == set(range(1, n + 1)) - set(query.history)
        assert items == [i for i, _, _ in same.items]
