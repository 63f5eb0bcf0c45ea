"""`python -m offline.bench.quality.temporal --tables-only --two-stage FILE`: the rankings and the table rebuilt
from the runs of a result JSON, with another run's two-stage rows merged (no training: fast)."""

import json
from pathlib import Path
from typing import Any

import pytest

from common.errors import SeqrecError
from offline.bench.quality.temporal import main as bench_main
from offline.bench.quality.temporal import merge_rows


def _run(model: str, protocol: str, seed: int | None, valid: float, test: float) -> dict[str, Any]:
    run: dict[str, Any] = {"model": model, "seed": seed, "protocol": protocol,
                           "valid": {"NDCG@10": valid}, "test": {"NDCG@10": test}}
    if protocol == "temporal":
        run["temporal"] = {"test": {"window_recall": {"Recall@10": test * 2}}}
    return run


def _result(tmp_path: Path) -> Path:
    runs = [_run("popularity", "loo", None, 0.03, 0.04), _run("popularity", "temporal", None, 0.06, 0.01),
            _run("personal-frequency", "loo", None, 0.03, 0.04),
            _run("personal-frequency", "temporal", None, 0.06, 0.01),
            _run("sasrec", "loo", 42, 0.10, 0.08), _run("sasrec", "loo", 123, 0.12, 0.10),
            _run("sasrec", "temporal", 42, 0.07, 0.03), _run("sasrec", "temporal", 123, 0.07, 0.05)]
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"command": "python -m offline.bench.quality.temporal --data D", "runs": runs}))
    return out


def _two_stage(tmp_path: Path, rows: dict[str, Any]) -> Path:
    path = tmp_path / "two-stage.json"
    path.write_text(json.dumps({"command": "another bench", "rankings": rows}))
    return path


def test_tables_only_merges_the_two_stage_rows_and_reranks(tmp_path: Path) -> None:
    out = _result(tmp_path)
    two_stage = _two_stage(tmp_path, {
        "loo": {"two-stage": {"valid": 0.13, "test": 0.12, "test_std": 0.01, "seeds": 3, "rank": 1},
                "retriever": {"valid": 1.0, "test": 1.0, "test_std": 0.0, "seeds": 3}},  # not merged: not asked for
        "temporal": {"two-stage": {"valid": 0.05, "test": 0.02, "test_std": 0.005, "seeds": 3,
                                   "test_window_recall@10": 0.07}}})
    assert bench_main(["--out", str(out), "--tables-only", "--two-stage", str(two_stage)]) == 0
    record = json.loads(out.read_text())
    loo, temporal = record["rankings"]["loo"], record["rankings"]["temporal"]
    assert set(loo) == {"popularity", "personal-frequency", "sasrec", "two-stage"}
    assert {m: r["rank"] for m, r in loo.items()} == {"two-stage": 1, "sasrec": 2, "popularity": 3,
                                                      "personal-frequency": 3}
    assert loo["sasrec"]["test"] == pytest.approx(0.09)
    assert {m: r["rank"] for m, r in temporal.items()} == {"sasrec": 1, "two-stage": 2, "popularity": 3,
                                                           "personal-frequency": 3}  # equal means share a rank
    assert temporal["two-stage"]["test_window_recall@10"] == 0.07
    assert temporal["two-stage"]["source"] == str(two_stage)
    assert record["command"] == "python -m offline.bench.quality.temporal --data D"  # the training command kept
    assert "--tables-only" in record["tables_command"]
    table = (tmp_path / "bench.md").read_text().splitlines()
    assert [line.split(" | ")[0] for line in table[2:]] == [
        "| two-stage", "| sasrec", "| popularity", "| personal-frequency"]
    assert table[2].startswith("| two-stage | 0.1200 | 1 | 0.0200 | 2 | 0.0700 | 0.1300 | 0.0500 |")
    assert bench_main(["--out", str(out), "--tables-only"]) == 0  # without the file: its rows are gone again
    assert "two-stage" not in json.loads(out.read_text())["rankings"]["loo"]


def test_a_two_stage_row_under_one_protocol_only_leaves_the_other_cell_empty(tmp_path: Path) -> None:
    out = _result(tmp_path)
    two_stage = _two_stage(tmp_path, {"loo": {"two-stage": {"valid": 0.01, "test": 0.02, "test_std": None,
                                                              "seeds": 1}}})
    assert bench_main(["--out", str(out), "--tables-only", "--two-stage", str(two_stage)]) == 0
    record = json.loads(out.read_text())
    assert "two-stage" not in record["rankings"]["temporal"]
    row = next(line for line in record["table"].splitlines() if line.startswith("| two-stage"))
    assert row == "| two-stage | 0.0200 | 4 |  |  |  | 0.0100 |  |"


@pytest.mark.parametrize(("rows", "message"), [
    ({"loo": {"two-stage": {"valid": 0.1, "test": 0.1}}}, "lacks test_std, seeds"),
    ({"loo": {"sasrec": {"valid": 0.1, "test": 0.1, "test_std": None, "seeds": 1}}}, "no rankings.loo.two-stage"),
])
def test_a_file_without_two_stage_rows_is_refused(tmp_path: Path, rows: dict[str, Any], message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        merge_rows({"loo": {}, "temporal": {}}, _two_stage(tmp_path, rows))


def test_a_file_that_is_not_a_result_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SeqrecError, match="not a result JSON"):
        merge_rows({"loo": {}, "temporal": {}}, bad)
    with pytest.raises(SeqrecError, match="not a result JSON"):
        merge_rows({"loo": {}, "temporal": {}}, tmp_path / "missing.json")


def test_tables_only_refuses_data_and_training_needs_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main(["--out", str(tmp_path / "x.json"), "--tables-only", "--data", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench_main(["--out", str(tmp_path / "x.json")])
