from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest

from retriever.index import (
    IndexSpec,
    build_index,
    gpu_available,
    load_index,
    normalize,
    save_index,
    search,
    set_search_params,
    spec_for_catalogue,
)


@pytest.fixture(autouse=True, scope="module")
def _one_faiss_thread() -> Iterator[None]:
    # One OpenMP thread makes HNSW insertion (and so its recall) reproducible, and spares the tests
    # OpenMP's spin-waiting, which is very slow on a shared 2-core machine.
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def _gaussian(n: int, d: int, seed: int) -> np.ndarray:
    # Continuous random data: exact score ties have probability ~0, so rows can be compared strictly.
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def _brute_force(queries: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ items.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, axis=1), rows


def _assert_same_ranking(scores: np.ndarray, rows: np.ndarray, want_scores: np.ndarray, want_rows: np.ndarray) -> None:
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    differ = rows != want_rows
    # Rows may only disagree where the two scores are exactly tied (never, with gaussian data).
    assert np.array_equal(scores[differ], want_scores[differ])


@pytest.fixture(scope="module")
def clustered() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """5,000 unit vectors of d=32 around 50 centres, 200 queries from the same mixture, exact top-10."""
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((50, 32)).astype(np.float32)
    items = normalize(centres[rng.integers(0, 50, 5000)] + 0.5 * rng.standard_normal((5000, 32)).astype(np.float32))
    queries = normalize(centres[rng.integers(0, 50, 200)] + 0.5 * rng.standard_normal((200, 32)).astype(np.float32))
    _, exact = _brute_force(queries, items, 10)
    return items, queries, exact


# ---------------------------------------------------------------------------------------------------- exact search


@pytest.mark.parametrize("batch_size", [4096, 7])
def test_flat_top_k_equals_brute_force(batch_size: int) -> None:
    items, queries = normalize(_gaussian(2000, 16, 0)), normalize(_gaussian(50, 16, 1))
    index = build_index(items, IndexSpec(kind="flat"))
    scores, rows = search(index, queries, 10, batch_size=batch_size)
    assert scores.dtype == np.float32
    assert rows.dtype == np.int64
    assert scores.shape == rows.shape == (50, 10)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    _assert_same_ranking(scores, rows, *_brute_force(queries, items, 10))


def test_k_is_clipped_to_index_size() -> None:
    items = normalize(_gaussian(5, 8, 0))
    _, rows = search(build_index(items), items, 10)
    assert rows.shape == (5, 5)
    assert sorted(rows[0].tolist()) == [0, 1, 2, 3, 4]
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]  # each unit vector is its own nearest neighbour


def test_exclude_removes_exactly_the_given_rows() -> None:
    items, queries = normalize(_gaussian(300, 16, 2)), normalize(_gaussian(6, 16, 3))
    index = build_index(items)
    _, nearest = _brute_force(queries, items, 20)
    exclude = [
        np.array([], dtype=np.int64),  # nothing excluded
        nearest[1, :3],  # the three best rows
        np.array([nearest[2, 0], nearest[2, 0], 299]),  # duplicates count once
        nearest[3, ::2],  # every other row of the top 20
        np.arange(0, 300, 2, dtype=np.int32),  # half the catalogue, another integer dtype
        np.array([nearest[5, 4]]),
    ]
    scores, rows = search(index, queries, 10, exclude=exclude, batch_size=4)  # exclusion across batches

    masked = queries @ items.T
    for i, excluded in enumerate(exclude):
        masked[i, excluded] = -np.inf
        assert not np.isin(rows[i], excluded).any()
    want_rows = np.argsort(-masked, axis=1, kind="stable")[:, :10]
    _assert_same_ranking(scores, rows, np.take_along_axis(masked, want_rows, axis=1), want_rows)


def test_exclude_covering_almost_everything_pads_with_minus_one() -> None:
    items = normalize(_gaussian(20, 8, 4))
    index = build_index(items)
    keep = [3, 11]
    exclude = [np.setdiff1d(np.arange(20), keep), np.array([], dtype=np.int64), np.arange(20)]
    scores, rows = search(index, items[:3], 5, exclude=exclude)
    assert sorted(rows[0, :2].tolist()) == keep
    assert rows[0, 2:].tolist() == [-1, -1, -1]
    assert np.all(np.isneginf(scores[0, 2:]))
    assert np.all(np.isfinite(scores[0, :2]))
    assert np.all(rows[1] >= 0)  # the unrestricted query still gets a full list
    assert rows[2].tolist() == [-1] * 5
    assert np.all(np.isneginf(scores[2]))


def test_an_ivf_search_that_comes_back_short_probes_every_list() -> None:
    # With 1 of 4 lists probed, IVF only ever sees about a quarter of the catalogue: such a query is searched again
    # over every list, so it gets the k the catalogue holds (the service promises k whenever k eligible items
    # remain, and evaluation counts the same search). It came back with about 50 of 200 rows before.
    items = normalize(_gaussian(200, 8, 20))
    index = build_index(items, IndexSpec(kind="ivf", nlist=4, nprobe=1))
    exact = build_index(items, IndexSpec(kind="flat"))
    for exclude, want in ((None, 200), ([np.array([0, 0, 5])] * 3, 198)):
        scores, rows = search(index, items[:3], 200, exclude=exclude)
        assert np.isfinite(scores[rows >= 0]).all()
        assert ((rows >= 0).sum(axis=1) == want).all()
        expected = search(exact, items[:3], 200, exclude=exclude)[1]
        assert [set(r[r >= 0]) for r in rows] == [set(r[r >= 0]) for r in expected]
    assert int(faiss.extract_index_ivf(index).nprobe) == 1  # the index's own setting is left alone


def test_results_the_index_cannot_find_are_padded() -> None:
    # with search parameters (a filter's selector) nothing is searched again: the caller falls back itself
    items = normalize(_gaussian(200, 8, 20))
    index = build_index(items, IndexSpec(kind="ivf", nlist=4, nprobe=1))
    params = faiss.SearchParametersIVF(nprobe=1)
    for exclude in (None, [np.array([0])] * 3):
        scores, rows = search(index, items[:3], 200, exclude=exclude, params=params)
        missing = rows == -1
        assert missing[:, -1].all()
        assert np.all(np.isneginf(scores[missing]))
        assert np.all(np.isfinite(scores[~missing]))


# ---------------------------------------------------------------------------------------------- approximate search


@pytest.mark.parametrize(
    ("spec", "min_recall"),
    [
        # Measured recall@10 on this data (seed 0, 1 or 2 threads): hnsw 1.000, ivf-flat 1.000 (128 lists,
        # nprobe 32), ivf-pq with pq_m=32 (one 8-bit code per dimension) 0.976. For reference pq_m=16 gives
        # 0.865 and pq_m=8 0.618 here: PQ trades recall for memory, so the test uses the finest split.
        pytest.param(IndexSpec(kind="hnsw"), 0.9, id="hnsw"),
        pytest.param(IndexSpec(kind="ivf"), 0.9, id="ivf-flat"),
        pytest.param(IndexSpec(kind="ivf", pq_m=32), 0.9, id="ivf-pq"),
    ],
)
def test_approximate_recall_against_exact(
    clustered: tuple[np.ndarray, np.ndarray, np.ndarray], spec: IndexSpec, min_recall: float
) -> None:
    items, queries, exact = clustered
    index = build_index(items, spec, seed=0)
    _, rows = search(index, queries, 10)
    recall = np.mean([len(set(got) & set(want)) / 10 for got, want in zip(rows, exact, strict=True)])
    assert recall >= min_recall


def test_ivf_default_nlist_keeps_39_points_per_list() -> None:
    index = build_index(normalize(_gaussian(100, 8, 5)), IndexSpec(kind="ivf"))
    assert faiss.extract_index_ivf(index).nlist == 2  # 4 * sqrt(100) = 40, clipped to 100 // 39
    index = build_index(normalize(_gaussian(20, 8, 5)), IndexSpec(kind="ivf"))
    assert faiss.extract_index_ivf(index).nlist == 1


def test_search_params_are_set_on_the_index() -> None:
    items = normalize(_gaussian(400, 8, 6))
    hnsw = build_index(items, IndexSpec(kind="hnsw", ef_search=77))
    assert isinstance(hnsw, faiss.IndexHNSW)
    assert hnsw.hnsw.efSearch == 77
    ivf = build_index(items, IndexSpec(kind="ivf", nlist=8, nprobe=3))
    assert faiss.extract_index_ivf(ivf).nprobe == 3
    set_search_params(ivf, IndexSpec(kind="ivf", nprobe=100))
    assert faiss.extract_index_ivf(ivf).nprobe == 8  # clipped to nlist


def test_ivf_build_is_reproducible_for_a_seed() -> None:
    items, queries = normalize(_gaussian(1000, 8, 8)), normalize(_gaussian(20, 8, 9))
    spec = IndexSpec(kind="ivf", nlist=16, nprobe=2)
    one = search(build_index(items, spec, seed=3), queries, 5)
    two = search(build_index(items, spec, seed=3), queries, 5)
    np.testing.assert_array_equal(one[1], two[1])


# ---------------------------------------------------------------------------------------------------- persistence


@pytest.mark.parametrize(
    "spec",
    [IndexSpec(kind="flat"), IndexSpec(kind="hnsw", hnsw_m=8), IndexSpec(kind="ivf", nlist=8, nprobe=2)],
    ids=["flat", "hnsw", "ivf"],
)
def test_save_load_round_trip(tmp_path: Path, spec: IndexSpec) -> None:
    items, queries = normalize(_gaussian(500, 16, 10)), normalize(_gaussian(30, 16, 11))
    index = build_index(items, spec)
    path = tmp_path / "items.faiss"
    save_index(index, path)
    assert [p.name for p in tmp_path.iterdir()] == ["items.faiss"]  # no temp file left behind

    loaded = load_index(path, spec, gpu=False)
    assert loaded.ntotal == 500
    want = search(index, queries, 10, exclude=[np.arange(i) for i in range(30)])
    got = search(loaded, queries, 10, exclude=[np.arange(i) for i in range(30)])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_load_applies_the_given_search_params(tmp_path: Path) -> None:
    path = tmp_path / "ivf.faiss"
    save_index(build_index(normalize(_gaussian(500, 8, 12)), IndexSpec(kind="ivf", nlist=8, nprobe=2)), path)
    assert faiss.extract_index_ivf(load_index(path, gpu=False)).nprobe == 2  # stored with the index
    assert faiss.extract_index_ivf(load_index(path, IndexSpec(kind="ivf", nprobe=5), gpu=False)).nprobe == 5


def test_failed_save_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "items.faiss"
    old = build_index(normalize(_gaussian(10, 8, 13)))
    save_index(old, path)
    before = path.read_bytes()

    def crash_mid_write(index: faiss.Index, fname: str) -> None:
        Path(fname).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(faiss, "write_index", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        save_index(build_index(normalize(_gaussian(20, 8, 14))), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["items.faiss"]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no index file"):
        load_index(tmp_path / "missing.faiss")
    junk = tmp_path / "junk.faiss"
    junk.write_bytes(b"not an index at all")
    with pytest.raises(ValueError, match="not a readable faiss index"):
        load_index(junk)


def test_gpu_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = normalize(_gaussian(100, 8, 15))
    flat_path, hnsw_path = tmp_path / "flat.faiss", tmp_path / "hnsw.faiss"
    save_index(build_index(items), flat_path)
    save_index(build_index(items, IndexSpec(kind="hnsw")), hnsw_path)
    if not gpu_available():
        with pytest.raises(ValueError, match="no GPU"):
            load_index(flat_path, gpu=True)

    # Pretend faiss is a GPU build with one device, to check which indexes load_index moves and how.
    moved: list[tuple[faiss.Index, bool]] = []

    class FakeClonerOptions:
        shard = False

    def fake_to_gpus(index: faiss.Index, co: FakeClonerOptions | None = None) -> faiss.Index:
        assert co is not None
        moved.append((index, co.shard))
        return index

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.delattr(faiss, "StandardGpuResources", raising=False)
    assert not gpu_available()  # a device count without the GPU API (CPU wheel) is not enough
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", FakeClonerOptions, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", fake_to_gpus)
    assert gpu_available()
    load_index(flat_path)
    assert len(moved) == 1
    assert moved[-1][1] is False
    load_index(flat_path, IndexSpec(gpu_shard=True))
    assert len(moved) == 2
    assert moved[-1][1] is True
    load_index(flat_path, gpu=False)
    load_index(hnsw_path)  # no GPU search for HNSW: stays on CPU
    load_index(hnsw_path, gpu=True)
    assert len(moved) == 2


# ------------------------------------------------------------------------------------------------- specs and inputs


def test_spec_dict_round_trip() -> None:
    spec = IndexSpec(kind="ivf", nlist=64, nprobe=8, pq_m=16)
    assert IndexSpec.from_dict(spec.to_dict()) == spec
    assert IndexSpec.from_dict({}) == IndexSpec()
    assert IndexSpec.from_dict({"kind": "hnsw", "ef_search": 64}) == IndexSpec(kind="hnsw", ef_search=64)
    assert IndexSpec.from_dict({"gpu_shard": True}).gpu_shard is True
    with pytest.raises(ValueError, match="gpu_shard"):
        IndexSpec.from_dict({"gpu_shard": "yes"})


def test_spec_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="efsearch"):
        IndexSpec.from_dict({"kind": "hnsw", "efsearch": 64})
    with pytest.raises(ValueError, match="'annoy'"):
        IndexSpec.from_dict({"kind": "annoy"})
    with pytest.raises(ValueError, match="nprobe"):
        IndexSpec.from_dict({"nprobe": 0})
    with pytest.raises(ValueError, match="hnsw_m"):
        IndexSpec.from_dict({"hnsw_m": "32"})


def test_normalize_makes_unit_rows_and_keeps_zero_rows_zero() -> None:
    vectors = np.array([[3.0, 4.0], [0.0, 0.0], [-1.0, 0.0]], dtype=np.float64)
    out = normalize(vectors)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]])
    assert vectors[0, 0] == 3.0  # the input is not modified
    assert normalize(np.asfortranarray(_gaussian(4, 3, 16))).flags.c_contiguous


def test_spec_for_catalogue_by_size() -> None:
    assert spec_for_catalogue(1_000).kind == "flat"
    assert spec_for_catalogue(200_000).kind == "flat"
    large = spec_for_catalogue(200_001)
    assert large == IndexSpec(kind="hnsw", hnsw_m=32, ef_construction=128, ef_search=256)


def test_clear_errors() -> None:
    items = normalize(_gaussian(50, 8, 17))
    index = build_index(items)
    with pytest.raises(ValueError, match="dimension 4 but the index has dimension 8"):
        search(index, _gaussian(3, 4, 18), 5)
    with pytest.raises(ValueError, match="k must be"):
        search(index, items[:2], 0)
    with pytest.raises(ValueError, match="2 entries for 3 queries"):
        search(index, items[:3], 5, exclude=[np.array([1]), np.array([2])])
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        search(index, items[:1], 5, exclude=[np.array([50])])
    nan = items.copy()
    nan[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        build_index(nan)
    with pytest.raises(ValueError, match="NaN"):
        search(index, nan, 5)
    with pytest.raises(ValueError, match="empty"):
        build_index(np.empty((0, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="2-D"):
        build_index(items[0])
    with pytest.raises(ValueError, match="must divide"):
        build_index(normalize(_gaussian(300, 10, 19)), IndexSpec(kind="ivf", pq_m=4))
    with pytest.raises(ValueError, match="at least 256"):
        build_index(items, IndexSpec(kind="ivf", pq_m=4))
