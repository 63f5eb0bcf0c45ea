"""`seqrec tune --protocol temporal`: trials train before the validation cut and are scored on its window; the
best trial's test window is read once, after the search, with what the protocol counts apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline.cli import main
from offline.data.prepared import load_prepared
from offline.data.temporal import temporal_split
from offline.tune import study
from tests.offline.tune.test_tune import BASE, PINS


def test_trials_are_scored_on_the_validation_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "synthetic"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "1", "--out", str(data), "--protocol", "temporal", "-q"]) == 0
    finals: list[int] = []
    real = study.temporal_metrics

    def figures(*args, **kwargs):  # type: ignore[no-untyped-def]
        finals.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(study, "temporal_metrics", figures)
    out = tmp_path / "tuned"
    assert main(["tune", "--data", str(data), "--out", str(out), "--trials", "1", "--protocol", "temporal",
                 *PINS, *BASE]) == 0
    result = json.loads((out / "result.json").read_text())
    split = temporal_split(load_prepared(data).sequences)
    assert result["protocol"] == {"protocol": "temporal", "valid_cut": "0.8", "test_cut": "0.9", "refit": False}
    assert result["temporal"]["valid"]["users"] == len(split.valid.users)
    assert result["temporal"]["test"]["users"] == len(split.test.users)
    assert "window_recall" in result["temporal"]["test"]
    # the search's best value is the best trial's validation-window figure, scored again after the search
    assert result["search_valid"]["NDCG@10"] == pytest.approx(result["valid"]["NDCG@10"], abs=1e-6)
    assert finals == [1]  # the test window: once, for the best trial
    # a leave-one-out study in the same folder is another search
    assert main(["tune", "--data", str(data), "--out", str(out), "--trials", "1", *PINS, *BASE]) == 1
