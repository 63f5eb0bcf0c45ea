import math

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from offline.analysis.geometry import (
    anisotropy,
    geometry,
    gini,
    k_occurrence,
    l2_norms,
    linear_cka,
    participation_ratio,
    skewness,
    spectrum,
    tsne_2d,
    twonn_dimension,
)


@pytest.fixture(autouse=True)
def _one_thread():
    # The inputs are tiny; OpenMP threads (t-SNE, FAISS) only spin against other work on the
    # machine and made one t-SNE call take 0.3 s to 20 s.
    with threadpool_limits(limits=1):
        yield


def _orthonormal(rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, cols) matrix with orthonormal columns."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((rows, cols)))
    return q


def _directions(degrees: list[float], scales: list[float]) -> np.ndarray:
    radians = np.deg2rad(degrees)
    return np.stack([np.cos(radians), np.sin(radians)], axis=1) * np.asarray(scales)[:, None]


# ---- spectrum and participation ratio ----


def test_spectrum_of_hand_written_2d_points() -> None:
    # (±3, 0) and (0, ±1): centred already; sample covariance (1/(n-1) = 1/3) is diag(18, 2) / 3.
    points = np.array([[3.0, 0.0], [-3.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    result = spectrum(points)
    assert result["eigenvalues"] == pytest.approx([6.0, 2 / 3])
    assert result["explained"] == pytest.approx([0.9, 0.1])
    assert result["cumulative"] == pytest.approx([0.9, 1.0])
    assert result["dims_for_90"] == 1


def test_spectrum_of_scaled_orthogonal_set_rotated_into_8_dims() -> None:
    # Rows ±s_j e_j: covariance diag(2 s_j² / (n-1)) with n = 8 rows; rotation keeps eigenvalues.
    scales = np.array([2.0, 1.0, 1.0, 1.0])
    axes = np.diag(scales)
    points = np.concatenate([axes, -axes]) @ _orthonormal(8, 4, seed=1).T  # (8, 8), rank 4
    result = spectrum(points)
    expected = [8 / 7, 2 / 7, 2 / 7, 2 / 7, 0, 0, 0, 0]
    assert result["eigenvalues"] == pytest.approx(expected, abs=1e-12)
    # shares 4/7, 1/7, 1/7, 1/7: cumulative 4/7, 5/7, 6/7 < 0.9, then 1.
    assert result["cumulative"] == pytest.approx([4 / 7, 5 / 7, 6 / 7, 1, 1, 1, 1, 1])
    assert result["dims_for_90"] == 4


def test_spectrum_reaches_90_exactly_despite_rounding() -> None:
    # Shares 0.3, 0.3, 0.3, 0.1: the float cumsum gives 0.8999999999999999 at 3 components.
    scales = np.sqrt([3.0, 3.0, 3.0, 1.0])
    points = np.concatenate([np.diag(scales), -np.diag(scales)])
    assert spectrum(points)["dims_for_90"] == 3


def test_spectrum_of_identical_rows_is_all_zero() -> None:
    result = spectrum(np.ones((5, 3)))
    assert result["eigenvalues"] == [0.0, 0.0, 0.0]
    assert result["explained"] == [0.0, 0.0, 0.0]
    assert result["dims_for_90"] == 0


def test_participation_ratio_hand_values() -> None:
    assert participation_ratio([1, 1, 1, 1]) == pytest.approx(4.0)
    assert participation_ratio([1, 0, 0]) == pytest.approx(1.0)
    assert participation_ratio([3, 1]) == pytest.approx(16 / 10)
    assert participation_ratio([0, 0]) == 0.0


def test_participation_ratio_of_isotropic_gaussian_is_the_dimension() -> None:
    cloud = np.random.default_rng(0).standard_normal((20_000, 16))
    assert participation_ratio(spectrum(cloud)["eigenvalues"]) == pytest.approx(16, rel=0.05)


# ---- TwoNN ----


def test_twonn_on_hand_built_line() -> None:
    # Points 0, 1, 3, 7, 15 on a line embedded in 2-D. (r1, r2) -> mu by hand:
    # 0: (1, 3) -> 3; 1: (1, 2) -> 2; 3: (2, 3) -> 1.5; 7: (4, 6) -> 1.5; 15: (8, 12) -> 1.5.
    direction = np.array([[0.6, 0.8]])
    line = np.array([0.0, 1.0, 3.0, 7.0, 15.0])[:, None] * direction
    # N = 5, discard 0.1 keeps floor(4.5) = 4 smallest mu with F = 1/5 .. 4/5.
    neg_log_survival = -np.log(1 - np.array([0.2, 0.4, 0.6, 0.8]))
    log_mu = np.log([1.5, 1.5, 1.5, 2.0])
    assert twonn_dimension(line) == pytest.approx(float(log_mu @ neg_log_survival / (log_mu @ log_mu)))

    # Two copies of 20: each has r1 = 0 and is dropped, yet both still count as neighbours of 15,
    # which now sees (5, 5) -> mu = 1. Sorted usable mu: 1, 1.5, 1.5, 2, 3.
    with_duplicates = np.concatenate([line, 20.0 * direction, 20.0 * direction])
    log_mu = np.log([1.0, 1.5, 1.5, 2.0])
    expected = float(log_mu @ neg_log_survival / (log_mu @ log_mu))
    assert twonn_dimension(with_duplicates) == pytest.approx(expected)


def test_twonn_recovers_3_dims_embedded_linearly_in_32() -> None:
    latent = np.random.default_rng(0).standard_normal((2000, 3))
    embedded = latent @ _orthonormal(32, 3, seed=1).T
    assert twonn_dimension(embedded) == pytest.approx(3.0, rel=0.15)


def test_twonn_recovers_10_dims() -> None:
    # r1/r2 would give a negative slope and an unlogged mu gives ~0.7, so 8..12 separates them.
    cloud = np.random.default_rng(2).standard_normal((2000, 10))
    assert 8.0 < twonn_dimension(cloud) < 12.0


def test_twonn_rejects_too_few_usable_points() -> None:
    with pytest.raises(ValueError, match="at least 3 usable"):
        twonn_dimension(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="at least 3 usable"):
        twonn_dimension(np.array([[0.0], [0.0], [1.0], [1.0], [5.0]]))  # only 5 has r1 > 0


# ---- hubness ----


def test_k_occurrence_on_directions_by_hand() -> None:
    # Angles 0, 10, 30, 90, 100 degrees; norms vary to show only the direction matters.
    points = _directions([0, 10, 30, 90, 100], [1.0, 5.0, 0.5, 2.0, 3.0])
    # k=1: 0->10, 10->0, 30->10, 90->100, 100->90.
    assert k_occurrence(points, k=1).tolist() == [1, 2, 0, 1, 1]
    # k=2: 0->{10,30}, 10->{0,30}, 30->{10,0}, 90->{100,30}, 100->{90,30}.
    counts = k_occurrence(points, k=2)
    assert counts.tolist() == [2, 2, 4, 1, 1]
    assert counts.dtype == np.int64
    assert counts.sum() == 5 * 2


def test_k_occurrence_excludes_self_by_id_not_position() -> None:
    # Exact duplicates tie with the query itself; each copy's neighbour must be its twin.
    points = _directions([0, 0, 90, 90], [1.0, 1.0, 1.0, 1.0])
    assert k_occurrence(points, k=1).tolist() == [1, 1, 1, 1]


def test_k_occurrence_ignores_zero_rows() -> None:
    points = _directions([0, 10, 30, 90, 100], [1.0, 5.0, 0.5, 2.0, 3.0])
    with_zero = np.insert(points, 2, 0.0, axis=0)
    assert k_occurrence(with_zero, k=2).tolist() == [2, 2, 0, 4, 1, 1]


def test_k_occurrence_rejects_k_at_least_n() -> None:
    points = _directions([0, 10, 30], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="k must be"):
        k_occurrence(points, k=3)


def test_gini_hand_values() -> None:
    assert gini(np.full(7, 3.0)) == pytest.approx(0.0)
    assert gini(np.array([0, 0, 0, 5.0])) == pytest.approx(3 / 4)
    # Sorted [1, 2, 3]: Σ(2i - n - 1)x_i = -2 + 0 + 6 = 4, over n Σx = 18.
    assert gini(np.array([3, 1, 2])) == pytest.approx(2 / 9)
    assert gini(np.zeros(4)) == 0.0


def test_skewness_hand_values() -> None:
    assert skewness(np.full(5, 2.0)) == 0.0
    assert skewness(np.array([-2.0, -1.0, 0.0, 1.0, 2.0])) == pytest.approx(0.0)
    # [0, 0, 3]: deviations -1, -1, 2 -> m2 = 2, m3 = 2, skew = 2 / 2^1.5.
    assert skewness(np.array([0.0, 0.0, 3.0])) == pytest.approx(1 / math.sqrt(2))


# ---- norms and anisotropy ----


def test_l2_norms() -> None:
    assert l2_norms(np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])).tolist() == [5.0, 0.0, 1.0]


def test_anisotropy_matches_brute_force_over_pairs() -> None:
    points = np.random.default_rng(3).standard_normal((50, 6)) + 0.7  # shifted so the mean is clearly > 0
    units = points / np.linalg.norm(points, axis=1, keepdims=True)
    cosines = [units[i] @ units[j] for i in range(50) for j in range(50) if i != j]
    assert anisotropy(points) == pytest.approx(np.mean(cosines), rel=1e-12)
    assert anisotropy(np.insert(points, 5, 0.0, axis=0)) == pytest.approx(np.mean(cosines), rel=1e-12)


def test_anisotropy_extremes() -> None:
    same_direction = np.array([[1.0, 2.0]]) * np.array([[1.0], [3.0], [0.5]])
    assert anisotropy(same_direction) == pytest.approx(1.0)
    assert anisotropy(np.array([[1.0, 0.0], [-2.0, 0.0]])) == pytest.approx(-1.0)
    assert abs(anisotropy(np.random.default_rng(4).standard_normal((2000, 32)))) < 0.01


# ---- CKA ----


def test_linear_cka_of_single_columns_is_squared_correlation() -> None:
    # Centred x = [-1, 0, 1], y = [-1, 1, 0]: (x·y)² / (|x|²|y|²) = 1 / 4.
    assert linear_cka(np.array([[1.0], [2.0], [3.0]]), np.array([[1.0], [3.0], [2.0]])) == pytest.approx(0.25)


def test_linear_cka_invariances() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 8))
    y = x @ rng.standard_normal((8, 5)) + 0.5 * rng.standard_normal((300, 5))
    assert linear_cka(x, x) == pytest.approx(1.0)
    base = linear_cka(x, y)
    assert 0.2 < base < 0.99
    rotation = _orthonormal(5, 5, seed=6)
    assert linear_cka(x, 3.7 * y @ rotation + 11.0) == pytest.approx(base)
    assert linear_cka(y, x) == pytest.approx(base)


def test_linear_cka_of_independent_matrices_is_small() -> None:
    rng = np.random.default_rng(7)
    assert linear_cka(rng.standard_normal((5000, 8)), rng.standard_normal((5000, 12))) < 0.1


def test_linear_cka_rejects_different_row_counts() -> None:
    with pytest.raises(ValueError, match="same rows"):
        linear_cka(np.zeros((4, 2)), np.zeros((5, 2)))


# ---- t-SNE ----


def _two_clusters() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(8)
    centres = np.eye(16)[[0, 1]] * 5.0  # orthogonal directions, so far apart under cosine too
    labels = np.repeat([0, 1], 30)
    return centres[labels] + 0.3 * rng.standard_normal((60, 16)), labels


def test_tsne_2d_is_deterministic_and_keeps_clusters_apart() -> None:
    points, labels = _two_clusters()
    layout = tsne_2d(points, seed=3)
    assert layout.shape == (60, 2)
    assert np.isfinite(layout).all()
    np.testing.assert_allclose(tsne_2d(points, seed=3), layout)
    distances = np.linalg.norm(layout[:, None] - layout[None], axis=2)
    np.fill_diagonal(distances, np.inf)
    assert (labels[distances.argmin(axis=1)] == labels).all()


def test_tsne_2d_runs_on_a_tiny_set() -> None:
    assert tsne_2d(_two_clusters()[0][:7]).shape == (7, 2)  # perplexity capped at 2


# ---- summary ----


def test_geometry_summary_fields() -> None:
    points = np.random.default_rng(9).standard_normal((200, 8))
    summary = geometry(points, k=5)
    assert summary["n_items"] == 200
    assert summary["dim"] == 8
    assert summary["spectrum"]["cumulative"][-1] == pytest.approx(1.0)
    assert summary["participation_ratio"] == pytest.approx(participation_ratio(summary["spectrum"]["eigenvalues"]))
    hubness = summary["hubness"]
    assert hubness["k"] == 5
    assert sum(hubness["k_occurrence"]) == 200 * 5
    assert hubness["max"] == max(hubness["k_occurrence"])
    assert summary["norms"]["values"] == pytest.approx(np.linalg.norm(points, axis=1).tolist())
    assert summary["norms"]["min"] <= summary["norms"]["mean"] <= summary["norms"]["max"]
    assert isinstance(summary["twonn_dimension"], float)
    assert abs(summary["anisotropy"]) < 0.05
