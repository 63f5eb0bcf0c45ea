"""Request bodies for load: histories of random catalogue items, or of real users' test inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import SeqrecError

if TYPE_CHECKING:
    from offline.data.prepared import PreparedDataset


def _payload(history: Sequence[str], k: int, candidates: int, rerank: bool) -> dict[str, Any]:
    return {"history": list(history), "k": k, "candidates": candidates, "rerank": rerank}


def load_catalogue(bundle: str | Path) -> np.ndarray:
    """BUNDLE/item_ids.npy: the external item ids the service knows."""
    path = Path(bundle) / "item_ids.npy"
    if not path.is_file():
        raise SeqrecError(f"{path}: not found; expected an artifact bundle with item_ids.npy")
    try:
        item_ids = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise SeqrecError(f"{path}: cannot read: {err}") from err
    return np.asarray(item_ids).astype(str)


def payloads_from_catalogue(item_ids: np.ndarray, n: int, min_len: int = 50, max_len: int = 200, seed: int = 0, *,
                            k: int = 10, candidates: int = 200, rerank: bool = True) -> list[dict[str, Any]]:
    """``n`` request bodies, each a history of min_len..max_len distinct catalogue ids in random order."""
    catalogue = np.asarray([str(item) for item in item_ids if str(item)])  # "" would be the padding placeholder
    if not 1 <= min_len <= max_len:
        raise SeqrecError(f"history lengths {min_len}..{max_len}: need 1 <= min_len <= max_len")
    if len(catalogue) < min_len:
        raise SeqrecError(f"the catalogue has {len(catalogue)} items, fewer than the shortest history ({min_len})")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, min(max_len, len(catalogue)) + 1, size=n)
    return [_payload(catalogue[rng.choice(len(catalogue), size=length, replace=False)].tolist(), k, candidates, rerank)
            for length in lengths]


def short_payloads(item_ids: np.ndarray, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` bodies of 5-50 catalogue items (fewer in a smaller catalogue): the reliability scenarios' requests."""
    return payloads_from_catalogue(item_ids, n, min(5, len(item_ids)), min(50, len(item_ids)), seed)


def payloads_from_dataset(dataset: PreparedDataset, n: int, min_len: int = 50, max_len: int = 200, seed: int = 0, *,
                          k: int = 10, candidates: int = 200, rerank: bool = True) -> list[dict[str, Any]]:
    """``n`` request bodies from real users' test inputs (everything but their last item), cut to the
    most recent ``max_len`` items; users with fewer than ``min_len`` are skipped, the rest sampled."""
    inputs = dataset.split().inputs("test")
    eligible = np.flatnonzero(inputs.lengths >= min_len)
    if not len(eligible):
        raise SeqrecError(f"{dataset.path}: no user has a test input of {min_len} items or more")
    rng = np.random.default_rng(seed)
    users = rng.choice(eligible, size=n, replace=n > len(eligible))
    return [_payload(dataset.item_ids[inputs.row(int(user))[-max_len:]].astype(str).tolist(), k, candidates, rerank)
            for user in users]
