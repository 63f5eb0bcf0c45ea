"""`seqrec backtest --choose-warm`: the warm-start schedule, chosen on the window before the backtest starts.

With ``start`` the backtest's first step and ``step`` its length, the choice replays one backtest step shifted back
by a step, on interactions that all precede ``start``:

    base     scratch, trained on what precedes start - 2 x step (the "previous step's bundle")
    scratch  scratch, trained on what precedes start - step
    warm_j   warm-started from base with candidate j's overrides, trained on what precedes start - step
    score    each bundle's nightly lists of the users active in [start - step, start), against their next item

The rule, fixed before any run: among the candidates at >= 0.98 x scratch's validation NDCG@k and <= 30 % of its
training seconds, the one that trained fastest; if none meets both, the best NDCG@k among those meeting the time
half; if none meets that, the best NDCG@k. The backtest's own windows (from ``start`` on) are never read: every
training set and the scored window end at ``start``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from common.atomic import write_json
from common.errors import SeqrecError
from offline.backtest.metrics import step_figures
from offline.backtest.replay import replay, user_windows
from offline.backtest.timeline import Timeline, check_plan, iso, write_step_config, write_training
from offline.jobs.pipeline_config import PipelineConfig

log = logging.getLogger(__name__)

QUALITY, TIME = 0.98, 0.30  # the warm-start target
EPOCHS, LR_SCALES, PATIENCE = (2, 4, 8), (0.5, 1.0), 2


def candidates(base_lr: float) -> list[dict[str, Any]]:
    """The grid: a short cosine horizon (epochs) x a learning-rate scale of the config's, no warm-up."""
    return [{"train.epochs": epochs, "train.patience": min(PATIENCE, epochs), "train.warmup_steps": 0,
             "train.lr": base_lr * scale} for epochs in EPOCHS for scale in LR_SCALES]


def pick(scratch: dict[str, float], tried: list[dict[str, Any]]) -> tuple[int, str]:
    """The index of the chosen candidate in ``tried`` (each with ``ndcg`` and ``train_seconds``) and why."""
    quality = [t["ndcg"] >= QUALITY * scratch["ndcg"] for t in tried]
    fast = [t["train_seconds"] <= TIME * scratch["train_seconds"] for t in tried]
    both = [j for j in range(len(tried)) if quality[j] and fast[j]]
    if both:
        return min(both, key=lambda j: tried[j]["train_seconds"]), "the fastest meeting both halves of the target"
    timely = [j for j in range(len(tried)) if fast[j]]
    if timely:
        return max(timely, key=lambda j: tried[j]["ndcg"]), "none met both halves: the best within the time half"
    return max(range(len(tried)), key=lambda j: tried[j]["ndcg"]), "none met the time half: the best"


def choose_warm(config: PipelineConfig, timeline: Timeline, start: float, step: float, folder: Path, *, k: int,
                threads: int | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """Train and score the grid on the validation window; returns the record written to ``folder/choice.json``
    (resumed from it when there)."""
    record = folder / "choice.json"
    if record.is_file():
        import json

        return dict(json.loads(record.read_text()))
    t_base, t_valid = start - 2 * step, start - step
    try:
        check_plan(timeline, t_base, step, 2)
    except SeqrecError as err:
        raise SeqrecError(f"--choose-warm needs two steps of data before --start (from {iso(t_base)}): {err}") \
            from None
    from retriever.config import load_config_with

    base_lr = load_config_with(config.retriever, {**config.overrides, **overrides}).train.lr
    base = _train(config, timeline, t_base, folder / "base", overrides, threads, warm_from=None)
    scratch = _score(_train(config, timeline, t_valid, folder / "scratch", overrides, threads, warm_from=None),
                     timeline, t_valid, start, k)
    tried = []
    for j, extra in enumerate(candidates(base_lr)):
        warm = config.model_copy(update={"warm_start_overrides": extra})
        trained = _train(warm, timeline, t_valid, folder / f"warm-{j}", overrides, threads, warm_from=base["bundle"])
        tried.append({"overrides": extra, **_score(trained, timeline, t_valid, start, k)})
        log.info("warm candidate %d %s: NDCG@%d %.4f (scratch %.4f), %.0f s (scratch %.0f s)", j, extra, k,
                 tried[-1]["ndcg"], scratch["ndcg"], tried[-1]["train_seconds"], scratch["train_seconds"])
    chosen, why = pick(scratch, tried)
    out = {"rule": f"fastest with NDCG@{k} >= {QUALITY} x scratch and train seconds <= {TIME} x scratch, else the "
                   "best within the time half, else the best (nightly next-item NDCG@k on the validation window)",
           "base_trained_before": iso(t_base), "valid_window": [iso(t_valid), iso(start)],
           "scratch": scratch, "candidates": tried, "chosen": chosen, "why": why,
           "overrides": tried[chosen]["overrides"]}
    write_json(record, out)
    return out


def _train(config: PipelineConfig, timeline: Timeline, t: float, folder: Path, overrides: dict[str, Any],
           threads: int | None, warm_from: str | None) -> dict[str, Any]:
    from offline.jobs.pipeline import run_pipeline
    from offline.jobs.versions import VERSIONS, switch_current

    data = folder / "data"
    if not (data / "interactions.parquet").is_file():
        write_training(timeline, t, data)
    artifacts = folder / "artifacts"
    if artifacts.exists():  # a killed choice: this candidate again from the start
        shutil.rmtree(artifacts)
    artifacts.mkdir(parents=True)
    if warm_from is not None:
        source = Path(warm_from)
        target = artifacts / VERSIONS / source.name
        shutil.copytree(source, target)
        switch_current(artifacts, target)
    path = write_step_config(config, data, folder, "pipeline", overrides=overrides, keep=2)
    summary = run_pipeline(path, artifacts, warm_start=warm_from is not None, threads=threads, keep=2)
    return {"bundle": str(Path(summary.path).resolve()), "train_seconds": float(summary.seconds.get("train") or 0.0)}


def _score(trained: dict[str, Any], timeline: Timeline, t0: float, t1: float, k: int) -> dict[str, Any]:
    from service.system.catalog import load_served

    bundle = load_served(Path(trained["bundle"]))
    replayed = replay(bundle, user_windows(timeline, t0, t1), t0, k)
    figures = step_figures(replayed, set(timeline.items[: timeline.before(t0)].tolist()), len(bundle.index_of), k)
    return {"ndcg": figures["nightly"][f"NDCG@{k}"], "live_ndcg": figures["live"][f"NDCG@{k}"],
            "users": figures["users"], "events": figures["events"], "train_seconds": trained["train_seconds"]}
