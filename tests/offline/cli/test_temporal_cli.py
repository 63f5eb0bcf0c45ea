"""`--protocol temporal` through the real CLI: prepare checks and records the split, train selects on the validation
window and refits, evaluate reproduces the artifact's figures, and what cannot run under it is refused in one line."""

import json
from pathlib import Path

import numpy as np
import pytest

from offline.cli import main
from offline.data.prepared import load_prepared
from offline.data.temporal import temporal_split
from retriever.artifact import read_manifest
from tests.tiny import TINY


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "synthetic"
    assert main(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                 "--seed", "1", "--out", str(out), "--protocol", "temporal", "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def refitted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts") / "t"
    assert main(["train", "--data", str(prepared), "--out", str(out), *TINY, "--protocol", "temporal", "--refit",
                 "-q"]) == 0
    return out


def test_prepare_records_the_split_it_checked(prepared: Path) -> None:
    data = load_prepared(prepared)
    record = data.manifest["split"]
    assert record == json.loads(json.dumps(temporal_split(data.sequences).record()))
    assert record["valid"]["users"] > 0
    assert record["test"]["users"] > 0


def test_train_refits_and_evaluate_reproduces_the_test_figures(refitted: Path, prepared: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    manifest = read_manifest(refitted)
    protocol = manifest.protocol  # type: ignore[attr-defined]
    assert protocol["protocol"] == "temporal"
    assert protocol["refit"] is True
    assert manifest.training is not None
    assert manifest.training["refit_epochs"] == manifest.training["best_epoch"]
    # the artifact stores the item counts of what the refit learnt from: everything before the test cut
    split = temporal_split(load_prepared(prepared).sequences)
    popularity = np.load(refitted / "popularity.npy", allow_pickle=False)
    assert popularity.sum() == len(split.refit_train.items)
    capsys.readouterr()
    assert main(["evaluate", "--artifact", str(refitted), "--data", str(prepared), "--protocol", "temporal"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "valid" not in result  # a refit learnt from the validation window: only the test window is scored
    assert result["protocol"]["refit"] is True  # read from the artifact
    assert result["test"] == manifest.metrics["test"]
    assert result["index"]["test"]["NDCG@10"] == pytest.approx(result["test"]["NDCG@10"], abs=1e-6)
    assert result["temporal"]["test"]["users"] == split.test.record()["users"]


def test_popularity_under_both_protocols(prepared: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["evaluate", "--model", "popularity", "--data", str(prepared), "--protocol", "temporal",
                 "--ks", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["valid"]) == {"HR@10", "NDCG@10", "MRR@10", "Recall@10"}
    assert set(result["temporal"]["test"]["window_recall"]) == {"Recall@10"}
    assert main(["evaluate", "--model", "popularity", "--data", str(prepared), "--protocol", "temporal", "--refit",
                 "--ks", "10"]) == 0
    refit = json.loads(capsys.readouterr().out)
    assert refit["valid"] == result["valid"]  # the validation window is scored by counts before its cut either way


def one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
    return err


def test_data_without_timestamps_is_refused_before_anything_is_written(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "events.csv"
    source.write_text("user,item\n" + "".join(f"u{u},i{(u + k) % 7}\n" for u in range(5) for k in range(4)))
    out = tmp_path / "prepared"
    code = main(["prepare", "--dataset", "csv", "--path", str(source), "--user-col", "user", "--item-col", "item",
                 "--time-col", "", "--out", str(out), "--protocol", "temporal", "-q"])
    assert code == 2
    assert "needs timestamps" in one_line_error(capsys)
    assert not out.exists()


def test_what_cannot_run_under_the_temporal_protocol_is_refused(refitted: Path, prepared: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    cases = [
        (["evaluate", "--artifact", str(refitted), "--data", str(prepared)], 2, "trained under the temporal"),
        (["evaluate", "--model", "popularity", "--data", str(prepared), "--valid-cut", "0.7"], 1,
         "applies to --protocol temporal"),
        (["evaluate", "--artifact", str(refitted), "--data", str(prepared), "--protocol", "temporal",
          "--stage", "two-stage", "--candidates", "30"], 1, "drop --candidates"),
        (["evaluate", "--artifact", str(refitted), "--data", str(prepared), "--protocol", "temporal",
          "--valid-cut", "0.7"], 2, "not under the temporal protocol asked for"),
        (["evaluate", "--model", "popularity", "--data", str(prepared), "--protocol", "temporal",
          "--valid-cut", "0.95"], 2, "must come before"),
        (["mine", "--artifact", str(refitted), "--data", str(prepared), "--out", str(tmp_path / "mined")], 2,
         "seqrec pipeline --protocol temporal"),
        (["train", "--data", str(prepared), "--out", str(refitted), *TINY, "--resume"], 1,
         "resume with its --protocol flags"),
        (["pipeline", "--config", "configs/pipeline/demo.yaml", "--out", str(tmp_path / "p"), "--valid-cut",
          "0.7"], 1, "applies to --protocol temporal"),
        (["tune", "--data", str(prepared), "--out", str(tmp_path / "t"), "--trials", "1", "--protocol", "temporal",
          "--valid-cut", "0.95"], 2, "must come before"),
    ]
    for argv, code, message in cases:
        capsys.readouterr()
        assert main([*argv, "-q"]) == code, argv
        assert message in one_line_error(capsys), argv
