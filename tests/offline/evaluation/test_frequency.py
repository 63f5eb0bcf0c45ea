"""The personal-frequency baseline's evaluation: its decay chosen on validation only, under both protocols."""

import json
from pathlib import Path

import pytest

from offline.cli import main
from offline.data.prepared import load_prepared
from offline.data.temporal import TemporalProtocol
from offline.evaluation.evaluate import evaluate_splits
from offline.evaluation.frequency import evaluate_frequency, evaluate_frequency_temporal
from offline.evaluation.temporal import evaluate_popularity_temporal
from retriever.frequency import PersonalFrequency
from retriever.popularity import Popularity
from tests.tiny import prepare_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tiny(tmp_path_factory.mktemp("frequency") / "data")


def test_decay_is_the_best_on_validation_and_test_is_read_with_it(tiny: Path) -> None:
    data = load_prepared(tiny)
    result = evaluate_frequency(data, repeats="allow", decays=(1.0, 0.5, 0.1))
    by_decay = result["valid_by_decay"]
    assert set(by_decay) == {"1.0", "0.5", "0.1"}
    assert by_decay[str(result["decay"])] == max(by_decay.values())
    split = data.split()
    chosen = PersonalFrequency.fit(split.train.items, data.n_items, result["decay"])
    assert evaluate_splits(chosen.score, split, data.n_items, exclude_seen=False) == {
        "valid": result["valid"], "test": result["test"]}


def test_under_exclude_it_is_popularity_and_keeps_counts(tiny: Path) -> None:
    data = load_prepared(tiny)
    result = evaluate_frequency(data, repeats="exclude")
    assert result["decay"] == 1.0
    assert list(result["valid_by_decay"]) == ["1.0"]
    popularity = Popularity.fit(data.split().train.items, data.n_items)
    assert evaluate_splits(popularity.score, data.split(), data.n_items) == {
        "valid": result["valid"], "test": result["test"]}
    temporal = TemporalProtocol("0.8", "0.9", refit=True)
    frequency_t = evaluate_frequency_temporal(data, temporal, repeats="exclude")
    popularity_t = evaluate_popularity_temporal(data, temporal, repeats="exclude")
    assert (frequency_t["valid"], frequency_t["test"]) == (popularity_t["valid"], popularity_t["test"])
    assert frequency_t["temporal"] == popularity_t["temporal"]


def test_temporal_chooses_on_the_validation_window(tiny: Path) -> None:
    data = load_prepared(tiny)
    result = evaluate_frequency_temporal(data, TemporalProtocol("0.8", "0.9"), repeats="allow", decays=(1.0, 0.3))
    assert result["valid_by_decay"][str(result["decay"])] == max(result["valid_by_decay"].values())
    assert result["temporal"]["valid"]["users"] > 0
    assert result["temporal"]["test"]["users"] > 0
    assert "Recall@10" in result["temporal"]["test"]["window_recall"]


def test_cli_evaluates_it_under_both_protocols(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--model", "personal-frequency", "--data", str(tiny), "--repeats", "allow"]) == 0
    loo = json.loads(capsys.readouterr().out)
    assert loo["model"] == "personal-frequency"
    assert loo["repeats"] == "allow"
    assert "decay" in loo
    assert main(["evaluate", "--model", "personal-frequency", "--data", str(tiny), "--protocol", "temporal",
                 "--refit"]) == 0
    temporal = json.loads(capsys.readouterr().out)
    assert temporal["protocol"]["refit"] is True
    assert "NDCG@10" in temporal["test"]
