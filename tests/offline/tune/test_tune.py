"""`seqrec tune`: a seeded search on the tiny data, resumed from its sqlite study, whose best.yaml trains;
the test split is read only after the search; bad arguments are one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from offline.cli import main
from offline.data.split import LeaveOneOut
from offline.tune.section import REPORT_FILES, keep_report
from offline.tune.space import ALPHA_RANGE, CUTS, SCHEDULES, DataShape, suggest
from offline.tune.study import FAILED_IN_A_ROW, Search
from retriever.config import config_from_dict
from tests.tiny import prepare_tiny

# Small choices of the searched sizes (the space's own values) keep each trial to a second or two.
PINS = ["--fix", "d_model=32", "--fix", "n_layers=1", "--fix", "max_len=20", "--fix", "batch_size=256"]
BASE = ["--train.epochs", "2", "--threads", "1", "--seed", "3", "-q"]


@pytest.fixture
def test_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records 'search' or 'final' for each read of the test split's inputs or targets."""
    reads: list[str] = []
    phase = ["search"]
    real_inputs, real_targets, real_final = LeaveOneOut.inputs, LeaveOneOut.targets, Search.final_metrics

    def inputs(self: LeaveOneOut, split: str):  # type: ignore[no-untyped-def]
        if split == "test":
            reads.append(phase[0])
        return real_inputs(self, split)  # type: ignore[arg-type]

    def targets(self: LeaveOneOut, split: str):  # type: ignore[no-untyped-def]
        if split == "test":
            reads.append(phase[0])
        return real_targets(self, split)  # type: ignore[arg-type]

    def final(self: Search, trial):  # type: ignore[no-untyped-def]
        phase[0] = "final"
        try:
            return real_final(self, trial)
        finally:
            phase[0] = "search"

    monkeypatch.setattr(LeaveOneOut, "inputs", inputs)
    monkeypatch.setattr(LeaveOneOut, "targets", targets)
    monkeypatch.setattr(Search, "final_metrics", final)
    return reads


def test_tune_searches_resumes_and_its_best_config_trains(tmp_path: Path, test_reads: list[str],
                                                           capsys: pytest.CaptureFixture) -> None:
    data, out = prepare_tiny(tmp_path / "data"), tmp_path / "tune"
    test_reads.clear()  # `seqrec prepare` records the test targets' repeat share; the search starts now
    args = ["tune", "--data", str(data), "--out", str(out), *PINS, *BASE]
    assert main([*args, "--trials", "2"]) == 0
    assert test_reads
    assert set(test_reads) == {"final"}
    with (out / "trials.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["trial"] for r in rows] == ["0", "1"]
    assert all(r["d_model"] == "32" and r["schedule"] in SCHEDULES for r in rows)
    first = json.loads((out / "result.json").read_text())
    assert first["valid"]["NDCG@10"] == pytest.approx(first["search_valid"]["NDCG@10"], abs=1e-6)
    assert "NDCG@10" in first["test"]
    assert (out / "history.png").read_bytes()[:4] == b"\x89PNG"
    assert "| trial | state |" in (out / "trials.md").read_text()

    # Rerunning continues the study in OUT/study.db: one more trial, numbered after the first two.
    assert main([*args, "--trials", "3"]) == 0
    assert json.loads((out / "result.json").read_text())["trials"] == 3
    assert (out / "trials" / "0002").is_dir()
    # Other pins would mix trials of two searches (best.yaml with d_model 32 under "fixed": {"d_model": 128}).
    capsys.readouterr()
    other = ["tune", "--data", str(data), "--out", str(out), *PINS[:-2], "--fix", "batch_size=128", *BASE]
    assert main([*other, "--trials", "4"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"seqrec: error: sqlite:///{(out / 'study.db').resolve()} holds a search with --fix d_model=32 n_layers=1 "
        "max_len=20 batch_size=256; resume it with the same, or choose a new --out")
    assert not (out / "trials" / "0003").exists()

    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["model"]["d_model"] == 32
    assert main(["train", "--config", str(out / "best.yaml"), "--data", str(data), "--out", str(tmp_path / "a"),
                 "-q"]) == 0
    assert (tmp_path / "a" / "manifest.json").exists()


@pytest.mark.parametrize(("extra", "message"), [
    ([], "needs --trials N or --budget-minutes M"),
    (["--trials", "0"], "--trials must be >= 1"),
    (["--trials", "1", "--fix", "width=3"], "unknown parameter(s) width"),
    (["--trials", "1", "--fix", "oops"], "must look like PARAM=VALUE"),
])
def test_bad_arguments_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str],
                                           message: str) -> None:
    assert main(["tune", "--data", str(tmp_path), "--out", str(tmp_path / "o"), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("seqrec: error:")
    assert message in err
    assert "\n" not in err


@pytest.mark.parametrize(("fix", "message"), [
    ("d_model=16", "--fix d_model=16: not one of 32, 64, 128"),
    ("alpha=0.5", "--fix alpha: not searched for this config (transformer)"),
    ("n_layers=7", "--fix n_layers=7: not a whole number from 1 to 3"),
    ("lr=1", "--fix lr=1: not a number from 0.0003 to 0.003"),
])
def test_a_pin_outside_the_space_is_refused_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             fix: str, message: str) -> None:
    """Optuna failed the first trial on it: a traceback in its log, then an internal error."""
    data = prepare_tiny(tmp_path / "data")
    out = tmp_path / "o"
    assert main(["tune", "--data", str(data), "--out", str(out), "--trials", "1", "--fix", fix, *BASE]) == 1
    assert capsys.readouterr().err.strip() == f"seqrec: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize(("storage", "shown", "reason"), [
    ("sqlite:////no/such/folder/study.db", "sqlite:////no/such/folder/study.db", "unable to open database file"),
    ("postgresql://tuner:s3cret@127.0.0.1:1/optuna", "postgresql://tuner:***@127.0.0.1:1/optuna",
     "Failed to import DB access module"),  # no driver installed
    ("not-a-url", "not-a-url", "Could not parse SQLAlchemy URL"),
])
def test_a_storage_that_cannot_be_opened_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, storage: str,
                                                     shown: str, reason: str) -> None:
    data = prepare_tiny(tmp_path / "data")
    assert main(["tune", "--data", str(data), "--out", str(tmp_path / "o"), "--trials", "1", "--storage", storage,
                 *PINS, *BASE]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"seqrec: error: --storage {shown}: cannot open the study: "), err
    assert reason in err
    assert "\n" not in err  # neither a traceback nor Optuna's experimental-feature warnings
    assert "s3cret" not in err


def test_an_out_that_holds_a_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # the search wrote its study, trials and best.yaml into the dataset's folder
    data = prepare_tiny(tmp_path / "data")
    before = sorted(p.name for p in data.iterdir())
    assert main(["tune", "--data", str(data), "--out", str(data), "--trials", "1"]) == 1
    assert capsys.readouterr().err.strip() == (f"seqrec: error: {data} already holds a prepared dataset written by "
                                               "`seqrec prepare`; choose a new --out")
    assert sorted(p.name for p in data.iterdir()) == before


def test_a_missing_data_folder_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["tune", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--trials", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("seqrec: error:")
    assert "\n" not in err


def _pipeline_config(tmp_path: Path, tune: dict) -> Path:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({
        "model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 10},
        "train": {"epochs": 2, "batch_size": 64, "seed": 3, "threads": 1}}))
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny",
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}},
        "retriever": "tiny.yaml", "ranker": {"kind": "none"}, "tune": tune}))
    return path


def test_pipeline_tune_section_needs_a_budget(tmp_path: Path) -> None:
    from common.errors import SeqrecError
    from offline.jobs.pipeline import load_pipeline_config

    assert load_pipeline_config(_pipeline_config(tmp_path, {"trials": 2})).tune is not None
    with pytest.raises(SeqrecError, match="trials or minutes"):
        load_pipeline_config(_pipeline_config(tmp_path, {"seed": 1}))
    with pytest.raises(SeqrecError, match="minutes: Input should be a finite number"):  # searched until killed
        load_pipeline_config(_pipeline_config(tmp_path, {"minutes": float("inf")}))


def test_pipeline_tunes_then_trains_the_best_config(tmp_path: Path) -> None:
    fix = {"d_model": 32, "n_layers": 1, "max_len": 20, "batch_size": 256}
    config = _pipeline_config(tmp_path, {"trials": 2, "fix": fix})
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "artifacts"), "-q"]) == 0
    manifest = json.loads((tmp_path / "artifacts" / "current" / "config.json").read_text())
    assert manifest["model"]["d_model"] == 32  # the tuned config, not tiny.yaml's 16
    published = tmp_path / "artifacts" / "current" / "tune"  # the search's report outlives the work folder
    assert sorted(p.name for p in published.iterdir()) == sorted(REPORT_FILES)


def test_a_published_bundle_keeps_the_search_report_but_not_the_study(tmp_path: Path) -> None:
    out, bundle = tmp_path / "tune", tmp_path / "bundle"
    (out / "trials" / "0000").mkdir(parents=True)
    bundle.mkdir()
    (out / "study.db").write_text("sqlite")
    keep_report(out, bundle)
    assert not (bundle / "tune").exists()  # no finished search (no best.yaml): nothing to keep
    for name in REPORT_FILES:
        (out / name).write_text(name)
    keep_report(out, bundle)
    assert sorted(p.name for p in (bundle / "tune").iterdir()) == sorted(REPORT_FILES)
    assert (bundle / "tune" / "trials.md").read_text() == "trials.md"


def test_a_trial_at_the_wall_clock_deadline_completes_with_its_best_epoch(tmp_path: Path) -> None:
    data, out = prepare_tiny(tmp_path / "data"), tmp_path / "tune"
    assert main(["tune", "--data", str(data), "--out", str(out), "--budget-minutes", "0.001", *PINS, *BASE,
                 "--train.epochs", "400", "--train.patience", "400"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["trials"] == 1  # the budget was spent during the first trial, which still counts
    with (out / "trials.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["state"] == "complete"
    # ended by the budget (at least 0.01 min, however little is left), long before the epoch limit or patience:
    # 400 epochs of the tiny model take seconds even on an idle machine, so this cannot pass by speed alone
    assert int(row["epochs"]) < 400
    assert "budget_minutes" not in yaml.safe_load((out / "best.yaml").read_text())["train"]


class _First:
    """A trial that takes the first choice and the low end of every range."""

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return choices[0]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return low

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return low


def test_bsarec_searches_its_filter_and_every_drawn_config_is_valid() -> None:
    shape = DataShape(max_lens=(20, 50))
    raw = suggest(_First(), {"model": {"backbone": "bsarec"}}, shape)
    assert raw["model"]["alpha"] == ALPHA_RANGE[0]
    assert raw["model"]["c"] == CUTS[0]
    assert raw["model"]["attn_dropout"] == raw["model"]["dropout"]
    assert config_from_dict(raw).train.windows == "prefixes"
    plain = suggest(_First(), {"model": {"backbone": "transformer"}}, shape)
    assert "alpha" not in plain["model"]
    assert "c" not in plain["model"]


def _three_each(tmp_path: Path) -> Path:
    """30 users of exactly 3 items: after validation and test, one training item each, so no trial can train."""
    log = tmp_path / "log.csv"
    log.write_text("user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 7},{t}\n" for u in range(30)
                                                          for t in range(3)))
    assert main(["prepare", "--dataset", "csv", "--path", str(log), "--out", str(tmp_path / "data"), "-q"]) == 0
    return tmp_path / "data"


def test_a_search_whose_trials_keep_failing_stops_with_their_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """Failed trials never count towards --trials: the search ran until killed (2,364 failed trials in 10 minutes).
    The budget bounds the old code's run here."""
    import offline.tune.study as study_module
    from retriever.config import ConfigError

    def failing(*args: object, **kwargs: object) -> None:
        raise ConfigError("no trial of this search can train")

    monkeypatch.setattr(study_module, "fit", failing)
    data = prepare_tiny(tmp_path / "data")
    capsys.readouterr()
    assert main(["tune", "--data", str(data), "--out", str(tmp_path / "o"), "--trials", "2", "--budget-minutes", "3",
                 *PINS, *BASE]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"seqrec: error: {FAILED_IN_A_ROW} trials in a row failed, the last with: no trial of this search can train")


def test_item_features_the_data_lacks_are_refused_before_any_trial(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """The search dropped them (the trials with them failed) and wrote a best.yaml without them."""
    data = prepare_tiny(tmp_path / "data")
    out = tmp_path / "o"
    assert main(["tune", "--data", str(data), "--out", str(out), "--trials", "1", "--model.item_features",
                 "no_such_column", *PINS, *BASE]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("seqrec: error: ")
    assert "no_such_column" in err[0]
    assert not out.exists()


def test_a_pipeline_pin_outside_the_space_is_named_as_the_config_names_it(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """The error said `--fix`, a flag the pipeline's user never gave."""
    config = _pipeline_config(tmp_path, {"trials": 1, "fix": {"d_model": 65}})
    assert main(["pipeline", "--config", str(config), "--out", str(tmp_path / "artifacts"), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqrec: error: tune.fix d_model=65: not one of ")


def test_the_search_imports_no_job() -> None:
    """`seqrec pipeline` runs a search (offline/tune), and the search imported `offline.jobs.train` back for the
    retriever's evaluation and data helpers; those live in offline/evaluation and offline/data, below both."""
    from tests.test_architecture import ROOT, imports

    below_the_jobs = ("offline.tune", "offline.evaluation", "offline.data")
    found = [i for i in imports(ROOT, ("common", "retriever", "ranker", "service", "offline"))
             if i.importer.startswith(below_the_jobs) and i.imported.startswith(("offline.jobs", "offline.cli"))]
    assert not found, "\n".join(map(str, found))
