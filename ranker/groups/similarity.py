"""Base: each candidate's cosines with the history (retriever item vectors): max, mean, last item, recent mean."""

from __future__ import annotations

import numpy as np

from ranker.groups import Columns, FeatureGroup, Inputs, register
from ranker.tables import RECENT
from retriever.windows import row_groups

COLUMNS = ("history_max_cos", "history_mean_cos", "last_item_cos", "recent_mean_cos")
# one group of `similarity_block` (a dozen numpy calls and row copies, ~40 us) costs about as much as this many
# more history positions of each row (~1.3 us each at 200 candidates)
HISTORY_GROUP_COST = 32


def _compute(x: Inputs) -> Columns:
    assert x.vectors is not None
    b, n = x.candidates.shape
    out = {name: np.empty((b, n), dtype=np.float32) for name in COLUMNS}
    similarity_features(out, x.vectors, x.history, x.hist_valid, x.hist_len, x.candidate_vectors)
    return out


def similarity_features(out: dict[str, np.ndarray], vectors: np.ndarray, history: np.ndarray,
                        hist_valid: np.ndarray, hist_len: np.ndarray, cand_vec: np.ndarray) -> None:
    """The four (B, N) columns into ``out``.

    Rows go in groups of similar history length (`retriever.windows.row_groups`), each cut to its longest
    history: a left-padded batch would otherwise multiply every candidate with every padding position too
    (histories of 50-200 items in one micro-batch: a third of this block's work). Padding adds nothing to any
    of the four, so a row's values do not depend on its group.
    """
    for rows, first in row_groups(history, HISTORY_GROUP_COST):
        similarity_block(out, rows, vectors, history[rows, first:], hist_valid[rows, first:], hist_len[rows],
                         cand_vec[rows])


def similarity_block(out: dict[str, np.ndarray], rows: slice | np.ndarray, vectors: np.ndarray,
                     history: np.ndarray, hist_valid: np.ndarray, hist_len: np.ndarray, cand_vec: np.ndarray) -> None:
    """`similarity_features` for some rows of the batch.

    Computed in float64 and rounded to float32 at the end: in float32 the sums' rounding depends on the
    batch's shape (how many users, how much left padding), and one ulp is enough to send a LightGBM tree
    down another branch, so the same user would be scored differently offline and in a served micro-batch.
    """
    cos = np.matmul(cand_vec.astype(np.float64), vectors[history].astype(np.float64).transpose(0, 2, 1))  # (B,N,T)
    out["history_max_cos"][rows] = np.maximum(np.where(hist_valid[:, None, :], cos, -np.inf).max(-1), -1.0)
    cos *= hist_valid[:, None, :]  # padding positions count 0 from here on
    out["history_mean_cos"][rows] = cos.sum(-1) / hist_len[:, None]
    out["last_item_cos"][rows] = cos[..., -1]
    recent = np.maximum(hist_valid[:, -RECENT:].sum(1), 1)
    out["recent_mean_cos"][rows] = cos[..., -RECENT:].sum(-1) / recent[:, None]


GROUP = register(FeatureGroup(
    "similarity", COLUMNS, _compute, base=30, id_derived=COLUMNS,
    doc=f"candidate vs each history item: max and mean cosine, the last item's, the mean over the last {RECENT}"))
