"""Filtered search (`retriever.index.filtered`) against a brute-force reference over the allowed rows."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from retriever.index import IndexSpec, build_index, normalize
from retriever.index.filtered import search_allowed

N, D = 3000, 16


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return normalize(np.random.default_rng(0).standard_normal((N, D)))


def _reference(vectors: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray,
               exclude: list[np.ndarray]) -> list[list[int]]:
    out = []
    for q, ex in zip(queries, exclude, strict=True):
        scores = vectors @ q
        rows = [r for r in np.argsort(-scores, kind="stable") if allowed[r] and r not in set(ex.tolist())]
        out.append(rows[:k])
    return out


@pytest.mark.parametrize("share", [0.01, 0.1, 0.5, 0.95])
@pytest.mark.parametrize("exact_max", [0, 2048])  # 0: always through the FAISS selector
def test_flat_filtered_top_k_equals_brute_force(vectors: np.ndarray, share: float, exact_max: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("retriever.index.filtered.EXACT_MAX", exact_max)
    rng = np.random.default_rng(1)
    allowed = rng.random(N) < share
    queries = normalize(rng.standard_normal((8, D)))
    exclude = [rng.choice(N, size=int(rng.integers(0, 40)), replace=False) for _ in range(8)]
    index = build_index(vectors, IndexSpec(kind="flat"))
    scores, rows = search_allowed(index, vectors, queries, 50, allowed, exclude=exclude)
    expected = _reference(vectors, queries, 50, allowed, exclude)
    for i, want in enumerate(expected):
        got = rows[i][rows[i] >= 0].tolist()
        assert got == want
        assert np.all(np.isneginf(scores[i][rows[i] < 0]))


@pytest.mark.parametrize("exact_max", [0, 2048])
def test_hnsw_never_returns_a_filtered_row_and_fills_k(vectors: np.ndarray, exact_max: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 % allow-list and a small efSearch: the graph walk comes back short, the exact fallback fills k."""
    monkeypatch.setattr("retriever.index.filtered.EXACT_MAX", exact_max)
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(2)
    allowed = rng.random(N) < 0.01
    index = build_index(vectors, IndexSpec(kind="hnsw", hnsw_m=8, ef_construction=40, ef_search=16))
    queries = normalize(rng.standard_normal((20, D)))
    history = [rng.choice(np.flatnonzero(allowed), size=3, replace=False) for _ in range(20)]
    k = 20
    _, rows = search_allowed(index, vectors, queries, k, allowed, exclude=history)
    for i in range(20):
        got = rows[i][rows[i] >= 0]
        assert allowed[got].all()
        assert not set(got.tolist()) & set(history[i].tolist())
        assert len(got) == min(k, int(allowed.sum()) - 3)


def test_fewer_allowed_rows_than_k_returns_them_all(vectors: np.ndarray) -> None:
    allowed = np.zeros(N, dtype=bool)
    allowed[[5, 17, 2999]] = True
    index = build_index(vectors, IndexSpec(kind="flat"))
    scores, rows = search_allowed(index, vectors, vectors[:2], 10, allowed)
    assert sorted(rows[0][rows[0] >= 0].tolist()) == [5, 17, 2999]
    assert (rows[:, 3:] == -1).all()
    assert np.isneginf(scores[:, 3:]).all()


def test_nothing_allowed_returns_nothing(vectors: np.ndarray) -> None:
    index = build_index(vectors, IndexSpec(kind="flat"))
    _, rows = search_allowed(index, vectors, vectors[:2], 10, np.zeros(N, dtype=bool))
    assert (rows == -1).all()


def test_allowed_of_the_wrong_length_is_refused(vectors: np.ndarray) -> None:
    index = build_index(vectors, IndexSpec(kind="flat"))
    with pytest.raises(ValueError, match="allowed has shape"):
        search_allowed(index, vectors, vectors[:1], 5, np.ones(N - 1, dtype=bool))
