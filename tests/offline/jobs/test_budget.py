"""The time budget's planner (offline/jobs/budget.py) on a fake cost model, and bad budgets refused before work."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from offline.cli import main
from offline.jobs import pipeline_plan
from offline.jobs.budget import BudgetError, Probe, check_budget, plan_budget

SIZED = {"model.max_len": 100, "model.d_model": 64, "model.n_layers": 2, "model.n_heads": 2,
         "train.epochs": 200, "train.schedule": "wsd"}


class FakeCosts:
    """Seconds per epoch proportional to window x width x layers (the probe a real run would time)."""

    def __init__(self, seconds_at_sized: float, eval_seconds: float = 0.0) -> None:
        self.unit, self.eval_seconds, self.calls = seconds_at_sized / (100 * 64 * 2), eval_seconds, 0

    def __call__(self, values: dict) -> Probe:
        self.calls += 1
        size = values["model.max_len"] * values["model.d_model"] * values["model.n_layers"]
        return Probe(self.unit * size, self.eval_seconds)


def test_epochs_shrink_first_and_each_retriever_is_capped_at_its_share() -> None:
    values, plan = plan_budget(10, SIZED, set(), FakeCosts(10.0), retrievers=2, n_users=1000)
    share = 0.3 * 600
    assert values["train.budget_minutes"] == pytest.approx(share / 60)
    assert values["train.epochs"] == math.floor(share / 10.0) == plan.epochs_that_fit
    assert values["train.schedule"] == "cosine"  # anneals over the epochs that fit
    assert values["train.patience"] == 10  # 18 epochs: the loop's default patience already exceeds 18 // 3
    _, longer = plan_budget(60, SIZED, set(), FakeCosts(10.0), retrievers=2, n_users=1000)
    assert longer.changed["train.patience"] == 108 // 3
    assert values["model.d_model"] == 64  # the model fits as sized
    assert plan.stages["train"] + plan.stages["mine"] + plan.stages["rest"] == pytest.approx(600)


def test_a_budget_with_room_for_every_epoch_keeps_the_epochs_and_the_schedule() -> None:
    values, _ = plan_budget(600, SIZED, set(), FakeCosts(1.0), retrievers=2, n_users=1000)
    assert values["train.epochs"] == 200
    assert values["train.schedule"] == "wsd"
    assert values["train.budget_minutes"] == pytest.approx(180)


def test_the_model_shrinks_when_too_few_epochs_fit_and_only_on_keys_not_given() -> None:
    costs = FakeCosts(100.0)  # 180 s per retriever: 1 epoch at the sized model, 3 needed
    values, plan = plan_budget(10, SIZED, set(), costs, retrievers=2, n_users=1000)
    assert (values["model.max_len"], values["model.d_model"], values["model.n_layers"]) == (50, 32, 1)
    assert plan.epochs_that_fit >= 3
    assert costs.calls == 2
    fixed, _ = plan_budget(10, SIZED, {"model.d_model", "model.n_heads", "train.epochs"}, FakeCosts(100.0),
                           retrievers=2, n_users=1000)
    assert fixed["model.d_model"] == 64
    assert fixed["train.epochs"] == 200
    assert fixed["model.max_len"] < 100


def test_validation_is_sampled_before_the_model_shrinks_when_it_costs_more_than_half_an_epoch() -> None:
    values, _ = plan_budget(10, SIZED, set(), FakeCosts(20.0, eval_seconds=60.0), retrievers=2, n_users=20_000)
    assert values["train.eval_users"] == 20_000 * 10 // 60
    assert values["model.d_model"] == 64


def test_a_budget_too_small_for_one_epoch_is_refused_with_what_it_would_take() -> None:
    floor = {"model.max_len": 10, "model.d_model": 32, "model.n_layers": 1, "model.n_heads": 1}
    with pytest.raises(BudgetError, match=r"too small: one epoch .* give at least 6 minutes"):
        plan_budget(1, floor, set(), lambda _: Probe(100.0, 0.0), retrievers=2, n_users=100)


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True, "ten"])
def test_check_budget_refuses_what_is_not_a_positive_number(bad: object) -> None:
    with pytest.raises(BudgetError, match="positive number of minutes"):
        check_budget(bad, "budget_minutes")  # type: ignore[arg-type]
    assert check_budget(None, "budget_minutes") is None
    assert check_budget(2, "x") == 2.0


def _config(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "budget",
        "data": {"dataset": "synthetic", "synthetic": {"n_users": 150, "n_items": 60, "mean_length": 12, "seed": 1}},
        **extra}))
    return path


@pytest.mark.parametrize("flag", ["0", "-3", "soon"])
def test_a_bad_budget_flag_exits_2_before_any_folder_is_made(tmp_path: Path, flag: str,
                                                             capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["pipeline", "--config", str(_config(tmp_path)), "--out", str(tmp_path / "a"), "--budget-minutes", flag])
    assert exit_.value.code == 2
    assert "--budget-minutes" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_a_bad_budget_in_the_config_exits_2_before_any_folder_is_made(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    code = main(["pipeline", "--config", str(_config(tmp_path, budget_minutes=0)), "--out", str(tmp_path / "a")])
    assert code == 2
    assert "budget_minutes must be a positive number of minutes, got 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_a_budget_the_probe_says_is_too_small_exits_2_before_training(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_plan, "probe_costs", lambda config, data: Probe(500.0, 1.0))
    code = main(["pipeline", "--config", str(_config(tmp_path)), "--out", str(tmp_path / "a"), "--threads", "1",
                 "--budget-minutes", "2"])
    assert code == 2
    err = capsys.readouterr().err
    assert "budget_minutes 2 is too small" in err
    assert "give at least" in err
    assert not (tmp_path / "a" / "versions").exists()
    assert not list((tmp_path / "a").glob("work/*/bundle/manifest.json"))  # no retriever trained


def test_the_progress_line_gives_the_stage_its_planned_time_and_the_time_to_the_publish() -> None:
    from offline.jobs.pipeline_plan import RunPlan, stage_eta
    from offline.jobs.sizing import SizingRecord

    _, budget = plan_budget(10, SIZED, set(), FakeCosts(10.0), retrievers=2, n_users=1000)
    plan = RunPlan(values={}, sizing=SizingRecord(applied=False), budget=budget)
    assert stage_eta(plan, "mine", 200.0) == "200 s of 600 s so far, this stage planned 180 s, publish due in 400 s"
    assert "planned 240 s" in stage_eta(plan, "train-ranker", 390.0)
    assert stage_eta(None, "train", 3.0) == "3 s so far"
