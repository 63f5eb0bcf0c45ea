"""What a `seqrec tune` search leaves in OUT: the best config, the trials, the history plot, the result.

    best.yaml     the best trial's run config, loadable by `seqrec train --config`
    trials.md     one row per trial: state, validation NDCG@10, epochs, minutes, the drawn values
    trials.csv    the same rows
    history.png   validation NDCG@10 of every trial in order, and the best so far
    result.json   the best trial's validation and test figures, side by side

`seqrec pipeline` publishes the same files (not the study or the trials' own folders) in the bundle's tune/
(`offline.tune.section.keep_report`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import optuna
import yaml
from matplotlib.figure import Figure

from common.atomic import atomic_write
from offline.tables import markdown_table

COLUMNS = ("trial", "state", "valid NDCG@10 (best)", "best epoch", "epochs", "minutes")


def trial_rows(study: optuna.Study) -> tuple[list[str], list[list[Any]]]:
    """The table's header and rows: the fixed columns, then every searched parameter."""
    trials = study.get_trials(deepcopy=False)
    params = sorted({name for t in trials for name in t.params})
    rows = []
    for t in trials:
        value = _best_value(t)
        cells: list[Any] = [t.number, t.state.name.lower(), _fmt(value), t.user_attrs.get("best_epoch", ""),
                            t.user_attrs.get("epochs_run", len(t.intermediate_values) or ""),
                            t.user_attrs.get("minutes", "")]
        rows.append(cells + [_fmt(t.params.get(name, "")) for name in params])
    return [*COLUMNS, *params], rows


def _best_value(t: optuna.trial.FrozenTrial) -> float | None:
    """A finished trial's value (its best epoch); a pruned one's best reported validation, not its last."""
    if t.state == optuna.trial.TrialState.PRUNED or t.value is None:
        return max(t.intermediate_values.values(), default=None)
    return t.value


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return "" if value is None else value


def plot_history(study: optuna.Study, path: Path) -> None:
    """Each trial's validation NDCG@10 (finished and pruned marked apart) and the best finished so far."""
    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axes = figure.add_subplot()
    best, best_line = -math.inf, []
    for state, marker in ((optuna.trial.TrialState.COMPLETE, "o"), (optuna.trial.TrialState.PRUNED, "x")):
        values = [(t.number, _best_value(t)) for t in study.get_trials(deepcopy=False, states=(state,))]
        points = [(n, v) for n, v in values if v is not None]
        if points:
            axes.scatter(*zip(*points, strict=True), marker=marker, label=state.name.lower())
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
            best = max(best, t.value)
        best_line.append((t.number, best if best > -math.inf else math.nan))
    if best_line:
        axes.step(*zip(*best_line, strict=True), where="post", label="best so far")
    axes.set_xlabel("trial")
    axes.set_ylabel("validation NDCG@10 (best epoch)")
    axes.set_title("seqrec tune: optimisation history")
    axes.legend()
    atomic_write(path, lambda p: figure.savefig(p, dpi=110, format="png"))


def write_report(study: optuna.Study, best_config: dict[str, Any], result: dict[str, Any], out: Path) -> None:
    header, rows = trial_rows(study)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write(out / "trials.csv", lambda p: p.write_text(buffer.getvalue()))
    intro = (f"# seqrec tune: {len(rows)} trials\n\nBest: trial {result['best_trial']}, validation NDCG@10 "
             f"{result['valid']['NDCG@10']:.4f} (test {result['test']['NDCG@10']:.4f}, read once after the "
             f"search).\n\n`{result['command']}`\n\n")
    table = markdown_table(header, rows)
    atomic_write(out / "trials.md", lambda p: p.write_text(intro + table + "\n"))
    comment = (f"# seqrec tune: trial {result['best_trial']} of {len(rows)}, best validation NDCG@10 "
               f"{result['valid']['NDCG@10']:.4f}\n# {result['command']}\n")
    text = comment + yaml.safe_dump(best_config, sort_keys=False)
    atomic_write(out / "best.yaml", lambda p: p.write_text(text))
    atomic_write(out / "result.json", lambda p: p.write_text(json.dumps(result, indent=2, default=str) + "\n"))
    plot_history(study, out / "history.png")
