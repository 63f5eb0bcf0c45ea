"""Geometry of an item-embedding matrix, for the xLSTM study's embedding-geometry analysis.

A retriever's ranking quality depends on how its item table fills the embedding space:
how many directions carry variance (spectrum, participation ratio, TwoNN intrinsic
dimension), whether a few items sit in everyone's neighbourhood (hubness via the
k-occurrence distribution), whether all items crowd into one cone (anisotropy), how
norms spread (norms feed straight into dot-product scores), and how similar two tables
are up to rotation and scale (linear CKA). All maths is float64 on (n, d) numpy arrays;
FAISS is used only to find exact neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import faiss
import numpy as np
from scipy import stats
from sklearn.manifold import TSNE

_CUMULATIVE_TOL = 1e-12  # so 0.3 + 0.3 + 0.3 counts as reaching 0.9 despite rounding


def _matrix(vectors: np.ndarray, min_rows: int = 1) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected an (n, d) matrix, got shape {matrix.shape}")
    if matrix.shape[0] < min_rows:
        raise ValueError(f"need at least {min_rows} rows, got {matrix.shape[0]}")
    return matrix


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    """The non-zero rows scaled to unit length (zero rows have no direction)."""
    norms = np.linalg.norm(matrix, axis=1)
    return matrix[norms > 0] / norms[norms > 0, None]


def spectrum(vectors: np.ndarray) -> dict[str, Any]:
    """Eigenvalues of the sample covariance (1/(n-1), as sklearn's PCA) of the centred rows, descending.

    dims_for_90 is the fewest leading components whose cumulative share reaches 0.9; when every
    row is equal (total variance 0) the shares are all 0 and dims_for_90 is 0.
    """
    matrix = _matrix(vectors, min_rows=2)
    centred = matrix - matrix.mean(axis=0)
    covariance = centred.T @ centred / (matrix.shape[0] - 1)  # (d, d)
    eigenvalues = np.clip(np.linalg.eigvalsh(covariance), 0.0, None)[::-1]
    total = float(eigenvalues.sum())
    explained = eigenvalues / total if total > 0 else np.zeros_like(eigenvalues)
    cumulative = np.cumsum(explained)
    reached = np.flatnonzero(cumulative >= 0.9 - _CUMULATIVE_TOL)
    dims_for_90 = int(reached[0]) + 1 if total > 0 else 0
    return {
        "eigenvalues": eigenvalues.tolist(),
        "explained": explained.tolist(),
        "cumulative": cumulative.tolist(),
        "dims_for_90": dims_for_90,
    }


def participation_ratio(eigenvalues: Sequence[float] | np.ndarray) -> float:
    """(Σλ)² / Σλ²: the number of equally loaded directions with the same spread; 0.0 when all λ are 0."""
    values = np.asarray(eigenvalues, dtype=np.float64)
    if np.any(values < 0):
        raise ValueError("eigenvalues must be non-negative")
    squares = float(np.sum(values**2))
    return float(np.sum(values) ** 2 / squares) if squares > 0 else 0.0


def twonn_dimension(vectors: np.ndarray, *, discard: float = 0.1) -> float:
    """TwoNN intrinsic dimension (Facco et al. 2017, Sci. Rep. 7:12140).

    mu_i = r2/r1 from each point's two nearest Euclidean neighbours, found exactly with
    faiss.IndexFlatL2 (float32; self dropped by id, so a duplicate can be a neighbour) and then
    re-measured in float64. Points with r1 == 0 (duplicates) are dropped. mu is sorted, the
    empirical CDF is F_i = i/N over the N usable points, the largest `discard` fraction of mu is
    dropped as in the paper (always at least the top point, whose F = 1 has no logarithm), and d
    is the slope of the least-squares line through the origin of -log(1 - F_i) against log(mu_i).
    """
    if not 0.0 <= discard < 1.0:
        raise ValueError(f"discard must be in [0, 1), got {discard}")
    matrix = _matrix(vectors)
    if matrix.shape[0] < 3:
        raise ValueError(f"TwoNN needs at least 3 usable points, got {matrix.shape[0]} rows")
    index = faiss.IndexFlatL2(matrix.shape[1])
    index.add(np.ascontiguousarray(matrix, dtype=np.float32))
    _, ids = index.search(np.ascontiguousarray(matrix, dtype=np.float32), 3)  # (n, 3)
    neighbours = _drop_self(ids, keep=2)  # (n, 2)
    # float64 re-measure: exact zeros for duplicates, where float32 ||a||²+||b||²-2ab may not be
    distances = np.stack([np.linalg.norm(matrix[neighbours[:, j]] - matrix, axis=1) for j in range(2)], axis=1)
    distances.sort(axis=1)  # float32 search order may disagree with float64 distances on near-ties
    usable = distances[:, 0] > 0
    if int(usable.sum()) < 3:
        raise ValueError(f"TwoNN needs at least 3 usable points (r1 > 0), got {int(usable.sum())}")
    mu = np.sort(distances[usable, 1] / distances[usable, 0])
    n_usable = len(mu)
    n_keep = min(int(np.floor(n_usable * (1.0 - discard))), n_usable - 1)
    log_mu = np.log(mu[:n_keep])
    neg_log_survival = -np.log1p(-np.arange(1, n_keep + 1) / n_usable)  # -log(1 - F_i), F_i = i/N
    denominator = float(log_mu @ log_mu)
    if denominator == 0.0:
        raise ValueError("TwoNN is undefined: every kept r2/r1 ratio is 1")
    return float(log_mu @ neg_log_survival / denominator)


def _drop_self(ids: np.ndarray, keep: int) -> np.ndarray:
    """(n, k+1) search ids -> (n, k): each row without its own id (or without its last hit when
    ties pushed itself out), so exact duplicates count as each other's neighbours."""
    not_self = ids != np.arange(len(ids))[:, None]
    self_missing = not_self.all(axis=1)
    not_self[self_missing, -1] = False
    return ids[not_self].reshape(len(ids), keep)


def k_occurrence(vectors: np.ndarray, k: int = 10) -> np.ndarray:
    """(n,) int64 count of how often each item is among the k cosine nearest neighbours of the others.

    Exact search (faiss.IndexFlatIP on L2-normalised float32 copies); each row's own id is excluded.
    Zero-norm rows have no direction, so they are left out of the search entirely: they are nobody's
    neighbour, have no neighbours, and get count 0. The counts then sum to n_nonzero * k.
    """
    matrix = _matrix(vectors)
    nonzero_rows = np.flatnonzero(np.linalg.norm(matrix, axis=1) > 0)
    if k < 1 or k >= len(nonzero_rows):
        raise ValueError(f"k must be in [1, {len(nonzero_rows)}) (non-zero rows), got {k}")
    units = np.ascontiguousarray(_unit_rows(matrix), dtype=np.float32)
    index = faiss.IndexFlatIP(units.shape[1])
    index.add(units)
    _, ids = index.search(units, k + 1)  # (m, k+1), positions within nonzero_rows
    neighbours = _drop_self(ids, keep=k)
    counts = np.zeros(matrix.shape[0], dtype=np.int64)
    np.add.at(counts, nonzero_rows[neighbours.ravel()], 1)
    return counts


def gini(values: np.ndarray) -> float:
    """Gini coefficient of non-negative values: 0 if uniform, (n-1)/n if one element holds all, 0.0 if the sum is 0."""
    sorted_values = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if sorted_values.size == 0 or sorted_values[0] < 0:
        raise ValueError("gini needs a non-empty array of non-negative values")
    total, n_values = float(sorted_values.sum()), sorted_values.size
    weights = 2 * np.arange(1, n_values + 1) - n_values - 1  # Σ(2i - n - 1) x_(i) over sorted x
    return float(weights @ sorted_values / (n_values * total)) if total > 0 else 0.0


def skewness(values: np.ndarray) -> float:
    """Biased sample skewness (scipy.stats.skew's default); 0.0 for a constant array instead of nan."""
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError("skewness of an empty array")
    if np.all(array == array[0]):
        return 0.0
    return float(stats.skew(array))


def l2_norms(vectors: np.ndarray) -> np.ndarray:
    """(n,) float64 Euclidean norm of each row."""
    return np.linalg.norm(_matrix(vectors), axis=1)


def anisotropy(vectors: np.ndarray) -> float:
    """Mean cosine similarity over all ordered pairs i != j of non-zero rows, exactly, in O(n d).

    With unit rows u and s = Σu, Σ_{i≠j} u_i·u_j = ||s||² − Σ||u_i||², so no (n, n) matrix is built.
    Zero rows have no direction and are excluded.
    """
    matrix = _matrix(vectors)
    units = _unit_rows(matrix)
    n_units = units.shape[0]
    if n_units < 2:
        raise ValueError(f"anisotropy needs at least 2 non-zero rows, got {n_units}")
    unit_sum = units.sum(axis=0)
    return (float(unit_sum @ unit_sum) - float(np.sum(units * units))) / (n_units * (n_units - 1))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) between two representations of the same n rows.

    Columns are centred, then CKA = ||YᵀX||_F² / (||XᵀX||_F ||YᵀY||_F): 1 for identical tables,
    unchanged by rotating or uniformly scaling either one.
    """
    x_matrix, y_matrix = _matrix(x), _matrix(y)
    if x_matrix.shape[0] != y_matrix.shape[0]:
        raise ValueError(f"linear_cka needs the same rows: {x_matrix.shape[0]} != {y_matrix.shape[0]}")
    x_centred = x_matrix - x_matrix.mean(axis=0)
    y_centred = y_matrix - y_matrix.mean(axis=0)
    cross = np.linalg.norm(y_centred.T @ x_centred) ** 2  # Frobenius
    denominator = np.linalg.norm(x_centred.T @ x_centred) * np.linalg.norm(y_centred.T @ y_centred)
    if denominator == 0:
        raise ValueError("linear_cka is undefined when either representation is constant")
    return float(cross / denominator)


def tsne_2d(vectors: np.ndarray, *, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """(n, 2) t-SNE layout under cosine distance; perplexity is capped at (n-1)/3 so small sets still run."""
    matrix = _matrix(vectors, min_rows=4)
    capped = min(perplexity, (matrix.shape[0] - 1) / 3)
    tsne = TSNE(n_components=2, metric="cosine", init="pca", random_state=seed, perplexity=capped)
    return np.asarray(tsne.fit_transform(matrix), dtype=np.float64)


def geometry(vectors: np.ndarray, *, k: int = 10) -> dict[str, Any]:
    """Every measure above except t-SNE and CKA, as one JSON-ready dict."""
    matrix = _matrix(vectors, min_rows=2)
    spectrum_summary, counts, norms = spectrum(matrix), k_occurrence(matrix, k), l2_norms(matrix)
    return {
        "n_items": int(matrix.shape[0]),
        "dim": int(matrix.shape[1]),
        "spectrum": spectrum_summary,
        "participation_ratio": participation_ratio(spectrum_summary["eigenvalues"]),
        "twonn_dimension": twonn_dimension(matrix),
        "hubness": {
            "k": k,
            "k_occurrence": counts.tolist(),
            "skewness": skewness(counts),
            "gini": gini(counts),
            "max": int(counts.max()),
        },
        "norms": {
            "values": norms.tolist(),
            "mean": float(norms.mean()),
            "std": float(norms.std()),
            "min": float(norms.min()),
            "max": float(norms.max()),
        },
        "anisotropy": anisotropy(matrix),
    }
