"""One `seqrec tune` search: an Optuna study whose trials are retriever training runs.

Each trial draws a config from the declared space (offline/tune/space.py) with a seeded TPE
sampler, trains it with the shared loop, and reports validation NDCG@10 after every evaluation
through the loop's validation callback, where the median pruner may stop it. The study lives in
an RDB storage (``OUT/study.db``, sqlite, by default): rerunning the same command continues it
up to ``trials`` finished trials. Nothing during the search reads the test split; once the search
ends, the best trial's weights are scored on validation and test, once, and reported side by side.

The budget is wall-clock minutes, or CPU minutes of this process (``clock="cpu"``) on a shared
machine, checked between trials. A trial running at the wall-clock deadline is ended by the
training loop's own ``train.budget_minutes`` (its best epoch counts, the trial completes); on the
CPU clock it is stopped at its next evaluation and counts as pruned.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
import torch
from sqlalchemy.engine import URL

from common.errors import SeqrecError, first_line
from common.redis_url import redact_url
from offline.data.features import with_item_features
from offline.data.prepared import PreparedDataset, dataset_fingerprint
from offline.data.temporal import TemporalProtocol, TemporalSplit, repeat_shares
from offline.evaluation.retriever import dense_metrics, evaluation_sample
from offline.evaluation.temporal import retriever_ranks, temporal_metrics
from offline.tune.report import write_report
from offline.tune.section import Clock, TuneSection
from offline.tune.space import PARAMS, DataShape, fixed_problems, suggest
from retriever.checkpoint import SELECTION_METRIC, load_weights, run_identity
from retriever.config import ConfigError, RunConfig, config_from_dict, load_config
from retriever.model import Retriever
from retriever.repeats import resolve_repeats
from retriever.train import Validate, fit

log = logging.getLogger(__name__)
STUDY_NAME = "seqrec-tune"
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


@dataclass(frozen=True)
class TuneOptions:
    trials: int | None = None  # finished trials the study should hold (a rerun adds the missing ones)
    budget_minutes: float | None = None  # of this invocation
    clock: Clock = "wall"
    seed: int = 0  # the TPE sampler's
    storage: str | None = None  # an Optuna RDB URL; default sqlite:///OUT/study.db
    fixed: dict[str, Any] = field(default_factory=dict)  # searched parameters pinned to a value
    fixed_from: str = "--fix"  # where the pins came from, for messages (a pipeline's `tune.fix`)
    startup_trials: int = 2  # trials the pruner lets finish before it compares
    warmup_evals: int = 5  # evaluations of a trial before it may be pruned

    def check(self) -> None:
        if self.trials is None and self.budget_minutes is None:
            raise SeqrecError("seqrec tune needs --trials N or --budget-minutes M (or both)")
        if self.trials is not None and self.trials < 1:
            raise SeqrecError(f"--trials must be >= 1, got {self.trials}")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise SeqrecError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        unknown = sorted(set(self.fixed) - set(PARAMS))
        if unknown:
            raise SeqrecError(f"--fix: unknown parameter(s) {', '.join(unknown)}; searched: {', '.join(PARAMS)}")


class Budget:
    """Minutes of wall-clock or process CPU time from now; None = no limit."""

    def __init__(self, minutes: float | None, clock: Clock) -> None:
        self.read: Callable[[], float] = time.process_time if clock == "cpu" else time.perf_counter
        self.minutes, self.start, self.clock = minutes, self.read(), clock
        self.started = {"wall": time.perf_counter(), "cpu": time.process_time()}

    def used(self) -> dict[str, float]:
        """Minutes used on both clocks (on a shared machine they differ)."""
        return {"wall_minutes": round((time.perf_counter() - self.started["wall"]) / 60, 2),
                "cpu_minutes": round((time.process_time() - self.started["cpu"]) / 60, 2)}

    def used_minutes(self) -> float:
        return (self.read() - self.start) / 60

    def spent(self) -> bool:
        return self.minutes is not None and self.used_minutes() >= self.minutes

    def wall_minutes_left(self) -> float | None:
        """Wall-clock minutes left (None: no wall-clock budget), for the training loop's own budget."""
        if self.minutes is None or self.clock != "wall":
            return None
        return max(0.01, self.minutes - self.used_minutes())


def with_features(raw: dict[str, Any], data: PreparedDataset, source: str = "trial config"
                  ) -> tuple[RunConfig, torch.Tensor | None]:
    """The run config of ``raw`` and its item-feature matrix, as `seqrec train` builds them."""
    return with_item_features(config_from_dict(raw, source=source), data)


def _reporting(validate: Validate, trial: optuna.Trial, eval_every: int, budget: Budget) -> Validate:
    """The training loop's validation callback, reporting each evaluation to the pruner."""
    evaluations = 0

    def report(model: Retriever) -> dict[str, float]:
        nonlocal evaluations
        metrics = validate(model)
        evaluations += 1
        trial.report(metrics[SELECTION_METRIC], evaluations * eval_every)
        out_of_cpu = budget.clock == "cpu" and budget.spent()  # wall-clock: the loop's own budget ends the trial
        if trial.should_prune() or out_of_cpu:
            trial.set_user_attr("stopped_by", "budget" if out_of_cpu else "pruner")
            raise optuna.TrialPruned(f"stopped after evaluation {evaluations}")
        return metrics

    return report


class Search:
    """What every trial of one search shares: the data, the base config, the output folder."""

    def __init__(self, base: dict[str, Any], data: PreparedDataset, out: Path, budget: Budget,
                 temporal: TemporalProtocol | None = None) -> None:
        self.base, self.data, self.out, self.budget = base, data, out, budget
        # temporal: train before the validation cut, score its window
        self.split = data.split() if temporal is None else temporal.split_data(data)
        self.shares = data.repeat_shares if temporal is None else repeat_shares(self.split)  # type: ignore[arg-type]
        self.shape = DataShape.from_lengths(self.split.train.lengths)

    def run_dir(self, number: int) -> Path:
        return self.out / "trials" / f"{number:04d}"

    def validation(self, config: RunConfig) -> Validate:
        exclude_seen = resolve_repeats(config.train.repeats, self.shares["valid"]) == "exclude"
        evaluated = evaluation_sample(self.split, config.train.eval_users, config.train.seed)
        n_items, max_len = self.data.n_items, config.max_len(self.data.n_items)

        def validate(model: Retriever) -> dict[str, float]:
            return dense_metrics(model, evaluated, n_items, max_len, ("valid",), config.train.eval_batch_size,
                                 exclude_seen=exclude_seen)["valid"]

        return validate

    def objective(self, trial: optuna.Trial) -> float:
        raw = suggest(trial, self.base, self.shape)
        trial.set_user_attr("config", json.dumps(raw))
        left = self.budget.wall_minutes_left()
        if left is not None:  # a trial at the deadline stops as `train.budget_minutes` does: its best epoch counts
            raw = copy.deepcopy(raw)
            raw["train"]["budget_minutes"] = min(left, raw["train"].get("budget_minutes") or left)
        config, features = with_features(raw, self.data)
        validate = _reporting(self.validation(config), trial, config.train.eval_every, self.budget)
        result = fit(config, self.split.train.offsets, self.split.train.items, self.data.n_items, validate,
                     self.run_dir(trial.number) / "run", progress=False, item_features=features)
        trial.set_user_attr("best_epoch", result.best_epoch)
        trial.set_user_attr("epochs_run", len(result.history))
        trial.set_user_attr("minutes", round(result.seconds / 60, 2))
        return result.best_metric

    def final_metrics(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        """The best trial's best epoch on validation and test: the one time the search reads test."""
        config, features = with_features(json.loads(trial.user_attrs["config"]), self.data)
        model = config.build(self.data.n_items)
        if features is not None:
            model.encoder.set_item_features(features)
        load_weights(self.run_dir(trial.number) / "run" / "best.pt", model)
        exclude_seen = resolve_repeats(config.train.repeats, self.shares["valid"]) == "exclude"
        evaluated = evaluation_sample(self.split, config.train.eval_users, config.train.seed)
        if isinstance(evaluated, TemporalSplit):  # the windows' headline, recall over the window, counted apart
            ranks = retriever_ranks(model, config.max_len(self.data.n_items), exclude_seen=exclude_seen,
                                    batch_size=config.train.eval_batch_size)
            return temporal_metrics(evaluated, ranks)
        return dense_metrics(model, evaluated, self.data.n_items, config.max_len(self.data.n_items),
                             ("valid", "test"), config.train.eval_batch_size, exclude_seen=exclude_seen)


class OtherSearch(SeqrecError):
    """The storage holds a study of another search: another base config, dataset or --fix."""


def sqlite_url(path: Path) -> str:
    """The sqlite URL of ``path``, escaped: OUT 'a#1?x' made the study a file 'a#1' (the rest read as the URL's
    query), and Optuna formats the URL as a template, so braces are escaped too."""
    url = URL.create("sqlite", database=str(path.resolve())).render_as_string(hide_password=False)
    return url.replace("{", "%7B").replace("}", "%7D")


def same_search(stored: dict[str, Any], identity: dict[str, Any]) -> bool:
    """Whether two searches' identities (pins aside) match: their base configs less the settings that only change
    speed (`run_identity`: train.threads), their data by checksum, not by the path it was read from (a rerun with
    an absolute --data, or without --threads, was refused). Data prepared before checksums keeps its path."""
    def comparable(identity: dict[str, Any]) -> dict[str, Any]:
        data = dict(identity.get("data") or {})
        if data.get("sha256"):
            data.pop("path", None)
        return {**identity, "base": run_identity(identity.get("base") or {}), "data": data, "fixed": None}

    return comparable(stored) == comparable(identity)


def open_study(out: Path, options: TuneOptions, identity: dict[str, Any]) -> optuna.Study:
    """The study in ``options.storage`` (default OUT/study.db), created or continued; refuses another search's."""
    out.mkdir(parents=True, exist_ok=True)
    url = options.storage or sqlite_url(out / "study.db")
    sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(seed=options.seed)
    if options.fixed:
        with _stable_enough():
            sampler = optuna.samplers.PartialFixedSampler(options.fixed, sampler)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=options.startup_trials, n_warmup_steps=options.warmup_evals)
    try:
        with _stable_enough():
            storage = optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
        study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction="maximize", sampler=sampler,
                                    pruner=pruner, load_if_exists=True)
    except (ImportError, ValueError, sqlalchemy.exc.SQLAlchemyError) as err:  # a path, a driver, a server
        raise SeqrecError(f"--storage {redact_url(url)}: cannot open the study: {first_line(err)}") from None
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
    elif same_search(stored, identity):
        if stored.get("fixed") != identity.get("fixed"):
            pins = " ".join(f"{k}={v}" for k, v in (stored.get("fixed") or {}).items())
            raise OtherSearch(f"{redact_url(url)} holds a search with {f'--fix {pins}' if pins else 'no --fix'}; "
                              "resume it with the same, or choose a new --out")
    else:
        raise OtherSearch(f"{redact_url(url)} holds a search of another config or dataset; choose a new --out")
    return study


@contextmanager
def _stable_enough() -> Iterator[None]:
    """Optuna marks the heartbeat and PartialFixedSampler experimental and warns on every run; the versions
    pyproject admits are the ones tested here, so the warning tells a user nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


FAILED_IN_A_ROW = 5  # trials that fail (an error, not a pruning) one after another before the search gives up


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def tune(base: dict[str, Any], data: PreparedDataset, out: Path, options: TuneOptions,
         command: str = "", temporal: TemporalProtocol | None = None) -> dict[str, Any]:
    """Search, then score the best trial on test once; writes OUT/{best.yaml,trials.md,trials.csv,history.png,
    result.json} and returns result.json's content. temporal: every trial trains before the validation cut and is
    scored on the validation window; the best one's test window is read once, after the search."""
    options.check()
    with_features(base, data, "base config")  # a bad base config, or item features the data lacks: before any trial
    budget = Budget(options.budget_minutes, options.clock)
    identity = {"base": base, "data": dataset_fingerprint(data)}
    if options.fixed:  # its trials sampled the pinned values only; studies without pins keep their identity
        identity["fixed"] = options.fixed
    identity.update({} if temporal is None else {"protocol": temporal.record()})  # a study is bound to its protocol
    search = Search(base, data, out, budget, temporal)
    if not (search.split.train.lengths >= 2).any():  # else every trial fails with it, five before the search stops
        raise ConfigError(f"{data.path}: no training sequence has two or more items")
    problems = fixed_problems(options.fixed, base, search.shape)
    if problems:
        raise SeqrecError(f"{options.fixed_from} {'; '.join(problems)}")
    study = open_study(out, options, json.loads(json.dumps(identity, default=str)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = 0  # every invocation runs one trial at least, however small its budget
    errors: list[str] = []  # the failed trials' errors, newest last; emptied by a trial that does not fail

    def objective(trial: optuna.Trial) -> float:
        try:
            return search.objective(trial)
        except SeqrecError as err:
            errors.append(str(err))
            raise
        except BaseException as err:
            if not isinstance(err, Exception | KeyboardInterrupt):  # what Optuna leaves running: SIGTERM's unwinding
                _fail(study, trial)
            raise

    while (started == 0 or not budget.spent()) and (options.trials is None or finished(study) < options.trials):
        started += 1
        study.optimize(objective, n_trials=1, catch=(SeqrecError,))
        trial = study.trials[-1]
        log.info("trial %d %s: valid %s %s (%.1f of %s %s-minutes used)", trial.number, trial.state.name,
                 SELECTION_METRIC, trial.value, budget.used_minutes(), options.budget_minutes, options.clock)
        if trial.state != optuna.trial.TrialState.FAIL:
            errors.clear()
        elif len(errors) >= FAILED_IN_A_ROW:  # failed trials never count towards --trials: this search cannot end
            raise SeqrecError(f"{len(errors)} trials in a row failed, the last with: {errors[-1]}")
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        raise SeqrecError(f"no trial finished within the budget ({finished(study)} pruned or stopped); "
                          "raise --budget-minutes or --trials")
    best = study.best_trial
    metrics = search.final_metrics(best)
    result = {
        "command": command, "trials": len(study.trials), "finished": finished(study),
        "best_trial": best.number, "best_params": best.params, "best_epoch": best.user_attrs.get("best_epoch"),
        "search_valid": {SELECTION_METRIC: best.value}, "valid": metrics["valid"], "test": metrics["test"],
        "budget": {"minutes": options.budget_minutes, "clock": options.clock, **budget.used()},
        "fixed": options.fixed,
        "sampler_seed": options.seed, "data": identity["data"],
        **({} if temporal is None else {"protocol": temporal.record(), "temporal": metrics["temporal"]})}
    write_report(study, json.loads(best.user_attrs["config"]), result, out)
    return result


def _fail(study: optuna.Study, trial: optuna.Trial) -> None:
    """Record ``trial`` as failed: a trial the CLI's SIGTERM ended stayed 'running' (in trials.md too) until
    Optuna's grace period, after the rerun had begun."""
    try:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    except Exception as err:  # the storage itself went away: the grace period marks it later
        log.warning("trial %d: could not record it as failed: %s", trial.number, first_line(err))


def tuned_config(section: TuneSection, base: dict[str, Any], data: PreparedDataset, out: Path,
                 temporal: TemporalProtocol | None = None) -> RunConfig:
    """The pipeline's retriever config: ``out/best.yaml`` of a finished search, or a search run (or continued) now.
    A search of another config in ``out`` (the run's own folder) cannot be continued: it starts afresh, as the
    run's training does, since every --resume would pick this run and be refused again."""
    best = out / "best.yaml"
    if not best.exists():
        options = TuneOptions(trials=section.trials, budget_minutes=section.minutes, clock=section.clock,
                              seed=section.seed, fixed=section.fix, fixed_from="tune.fix")
        try:
            tune(base, data, out, options, command="seqrec pipeline (tune section)", temporal=temporal)
        except OtherSearch:
            log.warning("%s holds a search of another retriever config; searching afresh", out)
            shutil.rmtree(out)
            tune(base, data, out, options, command="seqrec pipeline (tune section)", temporal=temporal)
    return load_config(best)
