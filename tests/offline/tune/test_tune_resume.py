"""Rerunning `seqrec tune` continues its study: what identifies a search, where the study lives, and what a
killed or hopeless search leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

import offline.tune.study as study_module
from common.errors import SeqrecError
from offline.cli import main
from offline.cli.seqrec import Terminated
from offline.tune.study import STUDY_NAME, TuneOptions, open_study
from tests.offline.tune.test_tune import BASE, PINS, _three_each
from tests.tiny import prepare_tiny

DATA = {"path": "d1", "source": "synthetic", "sha256": {"sequences.parquet": "ab12"}, "users": 200, "items": 60}
CONFIG = {"model": {"d_model": 16}, "train": {"epochs": 2}}


def _identity(data: dict[str, Any] = DATA, **train: Any) -> dict[str, Any]:
    return {"base": {**CONFIG, "train": {**CONFIG["train"], **train}}, "data": data}


def test_a_search_continues_under_other_threads_or_another_spelling_of_its_data(tmp_path: Path) -> None:
    """A rerun with --data /abs/d1 instead of d1, or without --threads, was refused ('holds a search of another
    config or dataset; choose a new --out'), and a pipeline's search killed midway never resumed."""
    out, options = tmp_path / "t", TuneOptions(trials=1)
    open_study(out, options, _identity(threads=1))
    open_study(out, options, _identity({**DATA, "path": "/tmp/sweep/d1"}))
    open_study(out, options, _identity(threads=2))
    with pytest.raises(SeqrecError, match="holds a search of another config or dataset"):
        open_study(out, options, _identity({**DATA, "sha256": {"sequences.parquet": "cd34"}}))
    with pytest.raises(SeqrecError, match="holds a search of another config or dataset"):
        open_study(out, options, _identity(epochs=3))
    old = tmp_path / "old"  # data prepared before checksums: its path is all that tells it apart
    open_study(old, options, _identity({**DATA, "sha256": {}}))
    with pytest.raises(SeqrecError, match="holds a search of another config or dataset"):
        open_study(old, options, _identity({**DATA, "sha256": {}, "path": "d2"}))


@pytest.mark.parametrize("name", ["a#1?x", "b{1}%20c@d:e"])
def test_the_study_lives_in_out_whatever_its_name(tmp_path: Path, name: str) -> None:
    """--out 'a#1?x' made the study a file 'a#1' beside it (the URL was not escaped)."""
    open_study(tmp_path / name, TuneOptions(trials=1), _identity())
    assert (tmp_path / name / "study.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    open_study(tmp_path / name, TuneOptions(trials=1), _identity())  # and is continued


def test_a_trial_ended_by_sigterm_is_recorded_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """SIGTERM's Terminated is no Exception, so Optuna left the trial 'running', in trials.md too after a rerun
    that started within its grace period."""
    data, out = prepare_tiny(tmp_path / "data"), tmp_path / "t"
    args = ["tune", "--data", str(data), "--out", str(out), "--trials", "1", *PINS, *BASE]

    def terminated(*args: object, **kwargs: object) -> None:
        raise Terminated

    monkeypatch.setattr(study_module, "fit", terminated)
    assert main(args) == 143
    monkeypatch.undo()
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]
    assert main(args) == 0
    table = (out / "trials.md").read_text()
    assert "running" not in table
    assert "| 0 | fail |" in table


def test_data_no_trial_can_train_on_is_refused_before_the_first(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Five trials failed, each with the same error, before the search gave up."""
    data, out = _three_each(tmp_path), tmp_path / "o"
    capsys.readouterr()
    assert main(["tune", "--data", str(data), "--out", str(out), "--trials", "2", *PINS, *BASE]) == 1
    assert capsys.readouterr().err.strip() == (
        f"seqrec: error: {data}: no training sequence has two or more items")
    assert not out.exists()


def test_a_pipelines_search_of_another_config_starts_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline run's tune/ is its own: a search there that cannot be continued was refused by every --resume,
    with a hint (a new --out) that does not apply to a pipeline."""
    from offline.tune.section import TuneSection

    out = tmp_path / "tune"
    (out / "trials" / "0000").mkdir(parents=True)
    calls: list[bool] = []

    def search(base: dict, data: object, folder: Path, options: TuneOptions, command: str,
               temporal: object = None) -> None:
        calls.append((folder / "trials").exists())
        if len(calls) == 1:
            raise study_module.OtherSearch("holds a search of another config or dataset")
        folder.mkdir()
        (folder / "best.yaml").write_text("model: {d_model: 32}\n")

    monkeypatch.setattr(study_module, "tune", search)
    config = study_module.tuned_config(TuneSection(trials=1), {}, None, out)  # type: ignore[arg-type]
    assert config.model.d_model == 32
    assert calls == [True, False]
