"""Request-time ranker features (`ranker.times`, `ranker.groups.request_time`): hand-computed values, only
interactions strictly before the request time count, the columns do not depend on the batch, and a dataset
without timestamps is refused with a message."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from offline.cli import main as seqrec
from ranker.features import extra_columns
from ranker.groups import Extras
from ranker.groups.request_time import COLUMNS as TIME_FEATURES
from ranker.times import DAY, NONE, TimeTable

T0 = 1_700_000_000


def _table() -> TimeTable:
    # item 1: 40, 10 and 2 days before T0 and at T0 itself; item 2: once, 100 days before; item 3: never
    items = np.array([1, 2, 1, 1, 1])
    times = np.array([T0 - 40 * DAY, T0 - 100 * DAY, T0 - 10 * DAY, T0 - 2 * DAY, T0])
    return TimeTable.build(items, times, n_items=3)


def test_hand_computed_columns() -> None:
    cand = np.array([[1, 2, 3, 7, 0]])  # 7: beyond the table (added after training), 0: an empty slot
    out = _table().columns(cand, np.array([T0]), np.array([T0 - 0.5 * DAY]))
    # the interaction at T0 itself is not before the request: it does not count
    np.testing.assert_allclose(out["recent_30d"][0], np.log1p([2, 0, 0, 0, 0]))
    np.testing.assert_allclose(out["recent_7d"][0], np.log1p([1, 0, 0, 0, 0]))
    np.testing.assert_allclose(out["days_since_last"][0], [math.log1p(2), math.log1p(100), NONE, NONE, NONE])
    np.testing.assert_allclose(out["days_since_first"][0], [math.log1p(40), math.log1p(100), NONE, NONE, NONE])
    np.testing.assert_allclose(out["user_idle_days"][0], [math.log1p(0.5)] * 5)
    assert set(out) == set(TIME_FEATURES)


def test_only_the_past_counts_and_no_window_reaches_another_item() -> None:
    table = _table()
    early = table.columns(np.array([[1, 2]]), np.array([T0 - 41 * DAY]), np.array([math.nan]))
    assert early["recent_30d"][0].tolist() == [0.0, pytest.approx(math.log1p(0))]
    assert early["days_since_last"][0].tolist() == [NONE, pytest.approx(math.log1p(59))]
    assert early["user_idle_days"][0].tolist() == [NONE, NONE]  # the user's newest interaction time is unknown
    # a request time near 0: the window start is clamped, so item 2's window never reaches item 1's rows
    near_zero = table.columns(np.array([[2]]), np.array([5 * DAY]))
    assert near_zero["recent_30d"][0, 0] == 0.0


def test_columns_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(0)
    items = rng.integers(1, 50, 2000)
    times = T0 + rng.integers(0, 200 * DAY, 2000)
    extras = Extras(TIME_FEATURES, {"times": TimeTable.build(items, times, n_items=50)})
    cand = torch.from_numpy(rng.integers(0, 52, (8, 30)))
    at = torch.from_numpy((T0 + rng.integers(0, 220 * DAY, 8)).astype(np.float64))
    last = at - 3600.0
    history = torch.zeros(8, 4, dtype=torch.int64)
    unknown = torch.zeros(8, 30, dtype=torch.bool)
    together = extra_columns(extras, history, cand, unknown, at, last)
    for u in range(8):
        alone = extra_columns(extras, history[u : u + 1], cand[u : u + 1], unknown[u : u + 1], at[u : u + 1],
                              last[u : u + 1])
        assert torch.equal(alone[0], together[u])
    with pytest.raises(ValueError, match="request's time"):
        extra_columns(extras, history, cand, unknown)


def test_timestamps_must_be_seconds() -> None:
    with pytest.raises(ValueError, match="seconds"):
        TimeTable.build(np.array([1]), np.array([-5]), n_items=1)
    with pytest.raises(ValueError, match="milliseconds"):  # 2023 in unix milliseconds
        TimeTable.build(np.array([1]), np.array([1_700_000_000_000]), n_items=1)


def test_data_without_timestamps_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = np.random.default_rng(1)
    (raw / "Toy.txt").write_text("".join(f"{u} " + " ".join(str(i) for i in rng.integers(1, 30, 8)) + "\n"
                                         for u in range(1, 41)))
    data, bundle = tmp_path / "data", tmp_path / "bundle"
    assert seqrec(["prepare", "--dataset", "s3rec", "--path", str(raw / "Toy.txt"), "--out", str(data), "-q"]) == 0
    assert seqrec(["train", "--data", str(data), "--out", str(bundle), "--model.d_model", "8", "--model.n_layers",
                   "1", "--model.n_heads", "1", "--model.max_len", "5", "--train.epochs", "1", "--threads", "1",
                   "-q"]) == 0
    capsys.readouterr()
    code = seqrec(["train-ranker", "--artifact", str(bundle), "--data", str(data), "--kind", "lgbm", "--mining",
                   "direct", "--depth", "10", "--threads", "1", "--features", "recent_30d", "-q"])
    assert code != 0
    err = capsys.readouterr().err
    assert "has no timestamps" in err
    assert "Traceback" not in err


def test_the_pipeline_check_names_the_features_and_the_data() -> None:
    from common.errors import SeqrecError
    from offline.jobs.tables import require_clock

    require_clock(Path("d"), {"has_timestamps": True}, ("recent_30d",))
    require_clock(Path("d"), {"has_timestamps": False}, ("cooc_last1",))  # no request-time feature: no clock needed
    with pytest.raises(SeqrecError, match=r"d has no timestamps .*\(recent_7d\)"):
        require_clock(Path("d"), {"has_timestamps": False}, ("cooc_last1", "recent_7d"))
