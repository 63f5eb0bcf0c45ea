"""The dense feature tensor, bit for bit, against what the code before the feature-group registry computed
(tests/ranker/fixtures/features_parity.npz: seeded inputs and the old code's outputs, written by
tests/ranker/fixtures/make_features_parity.py as committed in 3205520, run on the tree before it): the base columns
alone, every extra column, and a subset of the extras in another order, on left-padded histories of mixed lengths
with empty slots, unknown and masked candidates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ranker.cooc import CoocTable
from ranker.features import compute_features
from ranker.groups import Extras
from ranker.tables import ItemTables
from ranker.times import TimeTable

FIXTURE = Path(__file__).parent / "fixtures" / "features_parity.npz"


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    with np.load(FIXTURE, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _features(x: dict[str, Any], names: tuple[str, ...] | None) -> Any:
    n_items = int(x["n_items"])
    tables = ItemTables.build(x["offsets"], x["items"], n_items, x["meta"], x["years"]).torch()
    vectors = torch.nn.functional.normalize(torch.from_numpy(x["vectors"]), dim=-1)
    vectors[0] = 0
    user = torch.nn.functional.normalize(torch.from_numpy(x["user"]), dim=-1)
    args = (tables, vectors, torch.from_numpy(x["history"]), user, torch.from_numpy(x["candidates"]),
            torch.from_numpy(x["scores"]))
    if names is None:
        return compute_features(*args, id_mask=torch.from_numpy(x["id_mask"]))
    extras = Extras(names, {"cooc": CoocTable.build(x["offsets"], x["items"], n_items).torch(),
                            "times": TimeTable.build(x["items"], x["times"], n_items)})
    return compute_features(*args, id_mask=torch.from_numpy(x["id_mask"]), extras=extras,
                            at=torch.from_numpy(x["at"]), last_event=torch.from_numpy(x["last_event"]))


def _same_bits(got: torch.Tensor, expected: np.ndarray) -> None:
    assert got.dtype == torch.from_numpy(expected).dtype
    assert tuple(got.shape) == expected.shape
    assert np.array_equal(got.numpy().view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize(("names", "expected"), [(None, "dense_base"), ("extras", "dense_all"),
                                                 ("subset", "dense_subset")])
def test_dense_features_are_the_old_codes_bit_for_bit(saved: dict[str, Any], names: str | None,
                                                       expected: str) -> None:
    batch = _features(saved, None if names is None else tuple(str(n) for n in saved[names]))
    _same_bits(batch.dense, saved[expected])


def test_the_mlp_inputs_are_the_old_codes_bit_for_bit(saved: dict[str, Any]) -> None:
    batch = _features(saved, tuple(str(n) for n in saved["extras"]))
    _same_bits(batch.meta, saved["meta_out"])
    _same_bits(batch.year_bucket, saved["year_bucket_out"])
    _same_bits(batch.product, saved["product"])
