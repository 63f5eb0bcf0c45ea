"""Item metadata as model input: the item-feature matrix a retriever with ``model.item_features`` trains on."""

from __future__ import annotations

import numpy as np
import torch

from offline.data.errors import DataError
from offline.data.prepared import PreparedDataset
from retriever.config import RunConfig, config_from_dict
from retriever.features import feature_rows, feature_vocabulary, value_lists


def item_feature_matrix(data: PreparedDataset, column: str) -> tuple[np.ndarray, int]:
    """(n_items + 1, F) int64 ids of each item's values in ``column`` (a list or scalar column), 0 = none.

    Values are catalogue metadata (brand, category, genre), not interactions, so using every
    item's is no leak. Returns the matrix and the number of distinct values.
    """
    if column not in data.items.column_names:
        raise DataError(data.path / "items.parquet", f"no column {column!r} for model.item_features; "
                        f"columns: {', '.join(data.items.column_names)}")
    values = data.items.column(column).to_pylist()
    vocab = feature_vocabulary(values)
    width = max((len(r) for r in value_lists(values)), default=0)
    matrix = np.concatenate([np.zeros((1, max(1, width)), dtype=np.int64), feature_rows(values, vocab, width)])
    return matrix, len(vocab)


def with_item_features(config: RunConfig, data: PreparedDataset) -> tuple[RunConfig, torch.Tensor | None]:
    """``config`` completed with the size of its item features on ``data`` (``model.n_features`` and
    ``model.features_per_item``) and their matrix; ``config`` itself and None without ``model.item_features``.
    `seqrec train` and every trial of `seqrec tune` build their model from this."""
    if not config.model.item_features:
        return config, None
    features, n_features = item_feature_matrix(data, config.model.item_features)
    raw = config.model_dump(mode="json")
    raw["model"].update(n_features=n_features, features_per_item=features.shape[1])
    return config_from_dict(raw, source="config with item features"), torch.from_numpy(features)
