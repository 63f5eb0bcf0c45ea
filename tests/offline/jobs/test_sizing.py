"""The sized defaults in the pipeline (offline/jobs/sizing.py, pipeline_plan.py): only keys the config leaves unset,
only for the built-in defaults, recorded in the bundle, decided once per run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from offline.cli import main
from offline.data.prepare import Filters, prepare_dataset
from offline.data.prepared import load_prepared
from offline.data.readers import ReaderOptions
from offline.jobs import pipeline_plan
from offline.jobs.budget import Probe
from offline.jobs.pipeline_config import PipelineConfig
from offline.jobs.sizing import data_shape, size_values
from retriever.sizing import Device

SYNTHETIC = {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}}
GIVEN = {"model.d_model": 16, "model.n_heads": 2, "train.epochs": 2}


def _prepared(tmp_path: Path) -> Path:
    prepare_dataset("synthetic", tmp_path / "data", ReaderOptions(synthetic=SYNTHETIC["synthetic"]),
                    Filters(3, None, None))
    return tmp_path / "data"


def test_a_given_key_is_never_sized_and_the_record_says_which_is_which(tmp_path: Path) -> None:
    shape = data_shape(load_prepared(_prepared(tmp_path)))
    assert shape.users == 150
    assert shape.items <= 60
    assert shape.interactions == pytest.approx(shape.mean_length * shape.users, rel=0.01)
    values, record = size_values(shape, Device("cpu", 1), GIVEN)
    for key, value in GIVEN.items():
        assert values[key] == value
        assert key not in record.sized
        assert record.given[key] == value
    assert set(record.sized) == set(record.rules)
    assert "model.max_len" in record.sized
    assert record.statistics["interactions"] == shape.interactions


def test_a_name_and_data_pipeline_trains_the_sized_config_and_records_it(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"name": "sized", "data": SYNTHETIC, "overrides": GIVEN,
                                      "ranker": {"kind": "none"}}))
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "a"), "--threads", "1",
                 "--budget-minutes", "30"]) == 0
    bundle = tmp_path / "a" / "current"
    trained = json.loads((bundle / "config.json").read_text())
    train = json.loads((bundle / "pipeline.json").read_text())["stages"]["train"]
    sizing, budget = train["sizing"], train["budget"]
    assert sizing["applied"]
    assert sizing["given"] == {**GIVEN, "train.threads": 1}
    assert trained["model"]["d_model"] == 16
    assert trained["train"]["epochs"] == 2
    assert trained["loss"]["name"] == sizing["sized"]["loss.name"] == "full"  # 60 items: full softmax
    assert trained["model"]["max_len"] == sizing["sized"]["model.max_len"]
    assert trained["train"]["schedule"] == "wsd"
    assert trained["train"]["budget_minutes"] == pytest.approx(budget["retriever_seconds"] / 60)
    assert budget["budget_minutes"] == 30
    assert budget["retrievers"] == 1


def test_a_config_with_a_retriever_file_is_not_sized(tmp_path: Path) -> None:
    retriever = tmp_path / "r.yaml"
    retriever.write_text(yaml.safe_dump({"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
                                         "train": {"epochs": 2}}))
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"name": "given", "data": SYNTHETIC, "retriever": "r.yaml",
                                      "ranker": {"kind": "none"}}))
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "a"), "--threads", "1", "-q"]) == 0
    trained = json.loads((tmp_path / "a" / "current" / "config.json").read_text())
    assert trained["train"]["schedule"] == "constant"
    assert trained["loss"]["name"] == "infonce"
    sizing = json.loads((tmp_path / "a" / "current" / "pipeline.json").read_text())["stages"]["train"]["sizing"]
    assert sizing == {"applied": False, "statistics": {}, "device": {}, "sized": {}, "rules": {},
                      "given": {"train.threads": 1}}


def test_the_plan_is_decided_once_per_run_and_read_back_on_resume(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data = _prepared(tmp_path)
    calls: list[int] = []

    def probe(config: object, data: object) -> Probe:
        calls.append(1)
        return Probe(1.0 + len(calls), 0.1)  # a second probe would time differently

    monkeypatch.setattr(pipeline_plan, "probe_costs", probe)
    config = PipelineConfig.model_validate({"name": "p", "data": SYNTHETIC})
    first = pipeline_plan.plan_run(tmp_path, data, config, 1, 10)
    again = pipeline_plan.plan_run(tmp_path, data, config, 1, 10)
    assert len(calls) == 1
    assert again == first
    assert first.budget is not None
    assert first.budget.epoch_seconds == 2.0
