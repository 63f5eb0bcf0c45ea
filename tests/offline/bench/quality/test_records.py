"""Typed bench records read the committed results.json files as they are and write them back unchanged;
the one Markdown-table writer escapes what would add a column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import SeqrecError
from offline.bench.quality.records import RunRecord, config_sha256, read_results
from offline.bench.quality.results import merge_results
from offline.tables import markdown_header, markdown_row, markdown_table

RESULTS = Path(__file__).resolve().parents[4] / "docs" / "results"


@pytest.mark.parametrize("name", ["ml-100k-quick", "beauty"])  # a plain bench output, and a merge of merges
def test_committed_results_round_trip_key_for_key(name: str) -> None:
    raw = json.loads((RESULTS / name / "results.json").read_text())
    results = read_results(RESULTS / name / "results.json")
    dumped = [run.dump() for run in results.runs]
    assert dumped == raw["runs"]
    assert [list(run) for run in dumped] == [list(run) for run in raw["runs"]]  # same keys in the same order
    assert json.dumps(dumped) == json.dumps(raw["runs"])  # ints stay ints, floats stay floats


def test_a_failed_run_keeps_only_its_keys() -> None:
    record = RunRecord.model_validate({"model": "gru4rec", "seed": 42, "run": "r", "error": "ValueError: no"})
    assert record.failed
    assert record.dump() == {"model": "gru4rec", "seed": 42, "run": "r", "error": "ValueError: no"}
    future = RunRecord.model_validate({"model": "m", "seed": 1, "added_later": [1, 2]})
    assert future.dump() == {"model": "m", "seed": 1, "added_later": [1, 2]}


def test_a_broken_results_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"dataset": "x", "runs": [{"model": "m", "seed": "not a seed"}]}))
    with pytest.raises(SeqrecError, match=r"cannot read .*results.json: runs\.0\.seed: "):
        read_results(path)


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, "x|y"], ["—", ""]]) == "| a | b |\n|---|---|\n| 1 | x\\|y |\n| — |  |"
    assert markdown_header(["a"]) == "| a |\n|---|"
    assert markdown_row([]) == "|  |"


def test_config_hash_leaves_out_the_seed_and_the_data_derived_keys_only() -> None:
    config = {"model": {"backbone": "transformer", "max_len": 10, "d_model": 8, "n_layers": 1, "n_heads": 2},
              "loss": {"name": "full"}, "train": {"seed": 1, "lr": 0.001}}
    digest = config_sha256(config)
    assert len(digest) == 64
    assert config_sha256({**config, "train": {"seed": 2, "lr": 0.001}}) == digest
    assert config_sha256({**config, "train": {"lr": 1e-3}}) == digest  # the default seed, the same float
    stored = {**config, "model": {**config["model"], "n_features": 5, "features_per_item": 2}}
    assert config_sha256(stored) == digest  # a run folder's config.json, as training wrote it
    assert config_sha256({**config, "train": {"seed": 1, "lr": 0.002}}) != digest
    assert config_sha256({**config, "model": {**config["model"], "d_model": 16}}) != digest


def test_the_committed_tables_still_merge_to_the_same_table(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    # Their runs predate the hash and their run folders are gone: merged as before, with a warning.
    with caplog.at_level("WARNING"):
        rows = merge_results([RESULTS / "beauty"], tmp_path)
    assert "merged without checking" in caplog.text
    committed = json.loads((RESULTS / "beauty" / "results.json").read_text())
    merged = json.loads((tmp_path / "results.json").read_text())
    assert rows == merged["models"] == committed["models"]
    assert merged["runs"] == committed["runs"]
    assert (tmp_path / "results.csv").read_text() == (RESULTS / "beauty" / "results.csv").read_text()
    tables = [(path / "results.md").read_text().split("Reproduce:")[0] for path in (RESULTS / "beauty", tmp_path)]
    assert tables[0] == tables[1]
