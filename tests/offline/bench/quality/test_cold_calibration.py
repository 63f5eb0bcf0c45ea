"""The cold-start calibration bench end to end on a tiny split (hold out items, train without them, add them back
through `apply_changes` at several ID weights), its choice rule, and the committed record's command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from offline.bench.quality import cold_calibration
from offline.bench.quality.cold_start import main as cold_start
from offline.cli import main as seqrec
from retriever.config import ADDED_ID_WEIGHT
from tests.service.support import TINY_MODEL, prepare_synthetic

RECORD = Path(__file__).resolve().parents[4] / "docs" / "results" / "cold-calibration" / "results.json"


def _point(weight: float, ndcg: float, share: float) -> dict:
    return {"id_weight": weight, "cold": {"NDCG@10": ndcg}, "added_share_of_top10": share}


def test_the_choice_is_the_best_cold_ndcg_within_the_exposure_bar_else_the_least_exposed() -> None:
    frontier = [_point(0.0, 0.09, 0.60), _point(0.5, 0.05, 0.07), _point(1.0, 0.03, 0.02)]
    assert cold_calibration.choose(frontier, 0.075)["id_weight"] == 0.5
    assert cold_calibration.choose(frontier, 0.01)["id_weight"] == 1.0
    assert cold_calibration.choose(frontier, 0.9)["id_weight"] == 0.0


def test_the_bench_runs_the_served_additions_on_validation_and_reports_the_choice_on_test(tmp_path: Path) -> None:
    data = prepare_synthetic(tmp_path / "data")
    assert cold_start(["split", "--data", str(data), "--out", str(tmp_path / "cold"), "--share", "0.1",
                       "--seed", "1"]) == 0
    artifact = tmp_path / "cold" / "retriever"
    assert seqrec(["train", "--data", str(tmp_path / "cold" / "train"), "--out", str(artifact), *TINY_MODEL,
                   "--seed", "3", "--model.item_features", "genres", "-q"]) == 0
    out = tmp_path / "results"
    assert cold_calibration.main(["--data", str(data), "--split", str(tmp_path / "cold"), "--artifact",
                                  str(artifact), "--out", str(out), "--weights", "0", "1", "--sample", "40",
                                  "--offsets", "2"]) == 0
    record = json.loads((out / "results.json").read_text())
    frontier = record["valid_frontier"]
    assert [p["id_weight"] for p in frontier] == [0.0, 1.0]
    assert all(p["cold_users"] > 0 and 0 <= p["added_share_of_top10"] <= 1 for p in frontier)
    assert record["chosen_id_weight"] == cold_calibration.choose(frontier, record["exposure_bar"])["id_weight"]
    assert set(record["test"]) == {"before the additions", "baseline (weight 0)",
                                   f"chosen (weight {record['chosen_id_weight']:g})"}
    assert "added_share_of_top10" not in record["test"]["before the additions"]  # nothing added yet
    offset, = record["valid_offsets_not_served"]  # weight 0 and a score offset: measured only
    assert offset["offset"] == 2
    assert offset["added_share_of_top10"] <= frontier[0]["added_share_of_top10"]  # an offset only lowers them
    assert f"`{record['command']}`" in (out / "results.md").read_text()


def test_bad_arguments_are_a_clear_message_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cold_calibration.main(["--data", "d", "--split", "s", "--artifact", "a", "--out", "o",
                                  "--weights", "-1"]) == 2
    assert "--weights and --offsets must be >= 0" in capsys.readouterr().err


def test_the_committed_record_was_written_by_the_command_it_records() -> None:
    record = json.loads(RECORD.read_text())
    argv = shlex.split(record["command"])
    assert argv[:3] == ["python", "-m", "offline.bench.quality.cold_calibration"]
    args = cold_calibration.parser().parse_args(argv[3:])
    assert [p["id_weight"] for p in record["valid_frontier"]] == args.weights
    assert record["chosen_id_weight"] == cold_calibration.choose(record["valid_frontier"],
                                                                 record["exposure_bar"])["id_weight"]
    assert f"`{record['command']}`" in (RECORD.parent / "results.md").read_text()
    assert record["chosen_id_weight"] == ADDED_ID_WEIGHT  # what POST /admin/items serves by default
