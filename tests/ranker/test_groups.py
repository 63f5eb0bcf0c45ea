"""The ranker feature-group registry (`ranker.groups`): what it declares, and that a new group is one module.

The new group here (``repeat_count``: log1p of how often the candidate already is in the history) lives in a module
file the test writes into a folder of its own, the way a module of ranker/groups/ is found: nothing else names
it. With it registered, `seqrec train-ranker --features repeat_count` trains a ranker whose manifest lists the
column, the served system loads it and scores with the group's values; without it, the same bundle is refused
with a message naming the column, while rankers that do not read it (every saved one) still load.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import ranker.groups as registry
from offline.cli import main as seqrec
from ranker.features import COLUMN, DENSE_FEATURES, ID_DERIVED, compute_features
from ranker.groups import Extras, base_groups, groups, optional_columns, resolve, table_kind
from ranker.tables import ItemTables
from service.system.loader import load_bundle
from service.system.recommend import Query, recommend_batch
from tests.service.support import TINY_MODEL, prepare_synthetic

# The base columns every saved ranker's manifest starts with (`ranker.artifact` refuses another list): the groups
# must keep producing exactly these, in this order.
SAVED_BASE = ["retrieval_score", "retrieval_rank", "score_gap", "popularity", "is_unknown", "history_max_cos",
              "history_mean_cos", "last_item_cos", "recent_mean_cos", "meta_overlap", "meta_affinity",
              "history_length", "year_bucket", "year_distance", "follows_last", "follows_last_share",
              "follows_recent"]
SAVED_ID_DERIVED = ["retrieval_score", "retrieval_rank", "score_gap", "history_max_cos", "history_mean_cos",
                    "last_item_cos", "recent_mean_cos", "follows_last", "follows_last_share", "follows_recent"]

TOY_MODULE = '''
"""Optional: log1p of how often the candidate already is in the history."""

import numpy as np

from ranker.groups import FeatureGroup, register


def _compute(x):
    hits = (x.history[:, None, :] == x.candidates[:, :, None]) & (x.history[:, None, :] != 0)
    return {"repeat_count": np.log1p(hits.sum(-1)).astype(np.float32)}


GROUP = register(FeatureGroup("repeat_count", ("repeat_count",), _compute, doc=__doc__))
'''


def test_the_base_groups_make_the_saved_column_list() -> None:
    assert list(DENSE_FEATURES) == SAVED_BASE
    assert [DENSE_FEATURES[i] for i in ID_DERIVED] == SAVED_ID_DERIVED
    assert [g.base for g in base_groups()] == sorted(g.base for g in base_groups() if g.base is not None)


def test_every_column_belongs_to_one_group_and_every_table_is_declared() -> None:
    columns = [c for g in groups() for c in g.columns]
    assert len(columns) == len(set(columns))
    for group in groups():
        assert set(group.id_derived) <= set(group.columns)
        for name in group.tables:
            assert table_kind(name).file.endswith(".npz")
    assert set(optional_columns()) == {"cooc_last1", "cooc_last3", "cooc_last10", "cooc_rank", "popularity_trend",
                                       "recent_30d", "recent_7d", "days_since_last", "days_since_first",
                                       "user_idle_days", "meta_last", "meta_recent"}
    assert [g.name for g in resolve(["meta_recent", "cooc_rank", "meta_last"])] == ["recent_meta", "cooc"]
    with pytest.raises(ValueError, match=r"unknown ranker features \['nope'\]"):
        resolve(["cooc_rank", "nope"])


def test_a_group_cannot_take_another_groups_column() -> None:
    with pytest.raises(ValueError, match="taken"):
        registry.register(registry.FeatureGroup("clash", ("popularity",), lambda x: {}))
    with pytest.raises(ValueError, match="unknown tables"):
        registry.register(registry.FeatureGroup("tableless", ("needs_a_table",), lambda x: {}, tables=("nope",)))
    assert "clash" not in [g.name for g in groups()]


@pytest.fixture
def toy_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy module in a folder added to the package's search path, found by the registry's own discovery."""
    folder = tmp_path / "more_groups"
    folder.mkdir()
    (folder / "repeat_count.py").write_text(TOY_MODULE)
    groups()  # the shipped modules, imported once
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(folder)])
    monkeypatch.setattr(registry, "_loaded", False)
    yield
    registry.unregister("repeat_count")
    sys.modules.pop("ranker.groups.repeat_count", None)


def test_a_new_group_is_one_module(toy_group: None) -> None:
    assert "repeat_count" in optional_columns()
    tables = ItemTables.build(np.array([0, 4]), np.array([1, 2, 3, 2]), 4).torch()
    vectors = torch.nn.functional.normalize(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), dim=-1)
    vectors[0] = 0
    history = torch.tensor([[0, 2, 3, 2]])
    out = compute_features(tables, vectors, history, vectors[[1]], torch.tensor([[2, 3, 4, 0]]),
                           torch.tensor([[0.9, 0.5, 0.1, 0.0]]), extras=Extras(("repeat_count",)))
    assert out.dense.shape[-1] == len(DENSE_FEATURES) + 1
    assert out.dense[0, :, -1].tolist() == pytest.approx([np.log1p(2), np.log1p(1), 0.0, 0.0])  # empty slot: 0
    assert out.dense[0, 0, COLUMN["popularity"]] > 0  # the base columns are still there


def test_a_ranker_reading_a_new_group_trains_serves_and_is_refused_without_it(tmp_path: Path, toy_group: None,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data, bundle = prepare_synthetic(tmp_path / "data"), tmp_path / "bundle"
    assert seqrec(["train", "--data", str(data), "--out", str(bundle), *TINY_MODEL, "--seed", "0",
                   "--train.repeats", "allow", "-q"]) == 0
    plain = tmp_path / "plain"
    assert seqrec(["train", "--data", str(data), "--out", str(plain), *TINY_MODEL, "--seed", "0",
                   "--train.repeats", "allow", "-q"]) == 0
    for out, features in ((bundle, ["--features", "repeat_count"]), (plain, [])):
        assert seqrec(["train-ranker", "--artifact", str(out), "--data", str(data), "--kind", "lgbm", "--mining",
                       "direct", "--depth", "20", "--threads", "1", "-q", *features]) == 0
    manifest = json.loads((bundle / "ranker" / "manifest.json").read_text())
    assert manifest["features"]["dense"] == [*SAVED_BASE, "repeat_count"]
    served = load_bundle(bundle)
    assert served.ranker is not None
    assert served.ranker.extra_features == ("repeat_count",)
    history = [int(i) for i in np.random.default_rng(0).integers(1, 61, 8)]
    [result] = recommend_batch(served, [Query(history=history, k=5, candidates=20)])
    assert len(result.items) == 5
    assert result.reranked

    registry.unregister("repeat_count")  # the same seqrec without the module
    with pytest.raises(Exception, match=r"reads features \['repeat_count'\] that no feature group"):
        load_bundle(bundle)
    assert load_bundle(plain).ranker is not None  # a ranker that does not read it still loads
