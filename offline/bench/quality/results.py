"""The tables of `seqrec bench`: mean ± std over seeds per model, as OUT/results.{md,json,csv}, and merges.

``summarize`` turns run records into one row per model; ``write_results`` writes the three files
(rewritten after every run, so a long bench shows its progress); ``merge_results`` makes one table
from several bench outputs on the same data without retraining anything.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import atomic_write
from common.errors import SeqrecError
from offline.bench.quality.records import BenchMeta, BenchResults, RunRecord, config_sha256, read_results
from offline.tables import markdown_table

log = logging.getLogger(__name__)

TABLE_KS = (1, 5, 10, 50)
TABLE_METRICS = tuple(f"{name}@{k}" for name in ("HR", "NDCG", "MRR") for k in TABLE_KS)
RUN_STATS = ("params", "flops", "seconds_per_epoch", "best_epoch", "seconds_to_best", "inference_ms")
MERGE_KEYS = ("dataset", "users", "items", "max_epochs", "budget_minutes", "infer_batch")


def mean_std(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (n - 1 in the denominator; None for one value), to 6 decimals."""
    array = np.asarray(values, dtype=np.float64)
    std = round(float(array.std(ddof=1)), 6) if len(array) > 1 else None
    return {"mean": round(float(array.mean()), 6), "std": std}


def _model_row(label: str, runs: Sequence[RunRecord]) -> dict[str, Any]:
    """Mean ± std over the model's finished seeds; failed seeds go to the notes."""
    done = [r for r in runs if not r.failed]
    notes = [f"seed {r.seed} failed: {r.error}" for r in runs if r.failed]
    row: dict[str, Any] = {"model": label, "backbone": next((r.backbone for r in runs if r.backbone), None),
                           "seeds": [r.seed for r in done]}
    if not done:  # the error cell says why; the notes list the seeds only when their errors differ
        same = len({r.error for r in runs}) == 1
        return {**row, "error": runs[0].error, "notes": "" if same else "; ".join(notes)}
    for split in ("test", "valid"):
        metrics = [getattr(r, split) or {} for r in done]
        row[split] = {m: mean_std([values[m] for values in metrics]) for m in metrics[0]}
    row.update({key: mean_std([getattr(r, key) for r in done]) for key in RUN_STATS})
    row["max_len"] = done[0].max_len
    steps = [r.average_steps for r in done if r.average_steps is not None]
    if steps:
        row["average_steps"] = mean_std(steps)
        notes.insert(0, f"{row['average_steps']['mean']:.2f} steps on average at inference (test)")
    return {**row, "notes": "; ".join(notes)}


def summarize(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """One row per model, in order of first appearance; FLOPs relative to SASRec (or the first measured row)."""
    labels = dict.fromkeys(r.model for r in records)
    rows = [_model_row(label, [r for r in records if r.model == label]) for label in labels]
    measured = [r for r in rows if "flops" in r]
    if not measured:
        return rows
    reference = next((r for r in measured if r["backbone"] == "sasrec"), measured[0])
    for row in measured:
        row["relative_flops"] = row["flops"]["mean"] / reference["flops"]["mean"]
        row["flops_reference"] = reference["model"]
        if row["max_len"] != reference["max_len"]:
            row["notes"] = "; ".join(filter(None, [f"FLOPs at max_len {row['max_len']}", row["notes"]]))
    return rows


def cell(stat: dict[str, Any] | None, fmt: str) -> str:
    """``mean ± std`` (or the mean alone for one seed; "—" for nothing)."""
    if stat is None:
        return "—"
    text = format(stat["mean"], fmt)
    return text if stat["std"] is None else f"{text} ± {format(stat['std'], fmt)}"


def results_table(rows: Sequence[dict[str, Any]], split: str) -> str:
    """The reference tables' layout; the test table also carries size, compute, speed and notes."""
    full = split == "test"
    head = ["Model", *(["Params", "FLOPs (rel.)"] if full else []), *TABLE_METRICS,
            *(["s / epoch", "best epoch", "ms / batch", "notes"] if full else [])]
    lines = []
    for row in rows:
        cells = ["—"] * (len(head) - 1)
        if "error" in row and full:
            cells[-1] = f"**error**: {row['error']}"
        elif "error" not in row:
            cells = [cell(row[split].get(m), ".4f") for m in TABLE_METRICS]
            if full:
                cells = [f"{row['params']['mean']:,.0f}", f"{row['relative_flops']:.2f}×", *cells,
                         cell(row["seconds_per_epoch"], ".2f"), cell(row["best_epoch"], ".1f"),
                         cell(row["inference_ms"], ".1f"), row["notes"]]
        lines.append([row["model"], *cells])
    return markdown_table(head, lines)


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """One line per model; every statistic as separate mean and std columns."""
    stats = [(split, m) for split in ("test", "valid") for m in TABLE_METRICS]
    header = ["model", "backbone", "seeds", "relative_flops", "flops_per_sequence"]
    header += [f"{split}_{m}_{part}" for split, m in stats for part in ("mean", "std")]
    header += [f"{key}_{part}" for key in RUN_STATS if key != "flops" for part in ("mean", "std")]
    header += ["average_steps", "notes", "error"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        line: dict[str, Any] = {"model": row["model"], "backbone": row["backbone"],
                                "seeds": " ".join(map(str, row["seeds"])), "notes": row["notes"],
                                "error": row.get("error", "")}
        if "error" not in row:
            line["relative_flops"] = round(row["relative_flops"], 4)
            line["flops_per_sequence"] = row["flops"]["mean"]
            for split, m in stats:
                stat = row[split].get(m, {})
                line[f"{split}_{m}_mean"], line[f"{split}_{m}_std"] = stat.get("mean"), stat.get("std")
            for key in RUN_STATS:
                line[f"{key}_mean"], line[f"{key}_std"] = row[key]["mean"], row[key]["std"]
            line["average_steps"] = (row.get("average_steps") or {}).get("mean")
        writer.writerow(["" if line.get(h) is None else line[h] for h in header])
    return buffer.getvalue()


def _results_markdown(out: Path, rows: Sequence[dict[str, Any]], meta: BenchMeta) -> str:
    reference = next((r["flops_reference"] for r in rows if "flops_reference" in r), None)
    limits = [f"epochs capped at {meta.max_epochs}" if meta.max_epochs else "",
              f"{meta.budget_minutes} min wall-clock budget per run" if meta.budget_minutes else ""]
    limit = "; ".join(filter(None, limits))
    users = meta.users or 0
    return "\n\n".join([
        f"# Benchmark: {meta.dataset}",
        f"Data `{meta.data}` ({users:,} users, {meta.items or 0:,} items); seeds "
        f"{', '.join(map(str, meta.seeds))}; each cell is the mean ± sample std over the seeds that finished."
        + (f" **Quick comparison: {limit}.**" if limit else ""),
        "Leave-one-out, full ranking over every item, history excluded, ties counted against the target; "
        "each run keeps its best validation NDCG@10 epoch. FLOPs (rel.): one encoder forward over a sequence "
        f"of max_len items, counted with `torch.utils.flop_counter`, relative to {reference or '—'}. "
        "s / epoch: training pass only (no validation); best epoch: epochs to the best validation; "
        f"ms / batch: scoring {min(meta.infer_batch, users)} test users against every item.",
        "## Test", results_table(rows, "test"), "## Validation", results_table(rows, "valid"),
        *(meta.remarks or []),
        f"Reproduce: `{meta.command}`. Runs (artifacts): "
        + ("the `runs/` folder of each source command's `--out`" if meta.sources else f"`{out / 'runs'}`")
        + f"; resolved configs: `{out / 'configs'}`.",
    ]) + "\n"


def write_results(out: Path, records: Sequence[RunRecord], meta: BenchMeta) -> list[dict[str, Any]]:
    """OUT/results.{md,json,csv} from the run records; returns the summary rows."""
    rows = summarize(records)
    text = _results_markdown(out, rows, meta)
    atomic_write(out / "results.md", lambda p: p.write_text(text))
    payload = {**meta.dump(), "models": rows, "runs": [r.dump() for r in records]}
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(payload, indent=2) + "\n"))
    atomic_write(out / "results.csv", lambda p: p.write_text(csv_text(rows)))
    return rows


# --------------------------------------------------------------------------- merging bench outputs


def _read_sources(sources: Sequence[Path]) -> list[tuple[Path, BenchResults]]:
    """Each source's results.json; all on the same data under the same limits."""
    payloads = [(path, read_results(path)) for path in (s / "results.json" if s.is_dir() else s for s in sources)]
    if not payloads:
        raise SeqrecError("seqrec bench merge needs at least one --from")
    first_path, first = payloads[0]
    for path, payload in payloads[1:]:
        for key in MERGE_KEYS:
            if getattr(payload, key) != getattr(first, key):
                raise SeqrecError(f"{path} has {key}={getattr(payload, key)!r} but {first_path} has "
                                  f"{getattr(first, key)!r}; only runs on the same data under the same limits "
                                  "make one table")
    return payloads


Sourced = list[tuple[Path, RunRecord]]  # each run with the results.json it came from


def _collect_runs(payloads: Sequence[tuple[Path, BenchResults]], models: Sequence[str]) -> Sourced:
    """Every run of the sources (only ``models``' when given); a (model, seed) run twice is an error."""
    runs: Sourced = []
    seen: dict[tuple[str, int], Path] = {}
    for path, payload in payloads:
        for record in payload.runs:
            if models and record.model not in models:
                continue
            run = (record.model, record.seed)
            if run in seen:
                raise SeqrecError(f"{run[0]} seed {run[1]} is in both {seen[run]} and {path}")
            seen[run] = path
            runs.append((path, _with_config_hash(record)))
    return runs


def _with_config_hash(record: RunRecord) -> RunRecord:
    """A record written before runs carried their config hash gets it from its run folder, if still there."""
    stored = Path(record.run) / "config.json" if record.run else None
    if record.config_sha256 is not None or stored is None or not stored.is_file():
        return record
    digest = config_sha256(json.loads(stored.read_text()), source=str(stored))
    return record.model_copy(update={"config_sha256": digest})


def _check_one_config_per_model(runs: Sourced) -> None:
    """Every run of a model must come from one config (its seed aside); unhashed runs are merged with a warning."""
    first: dict[str, tuple[str, int, Path]] = {}
    unchecked: dict[str, list[int]] = {}
    sources: dict[Path, None] = {}
    for path, record in runs:
        if record.config_sha256 is None:
            unchecked.setdefault(record.model, []).append(record.seed)
            sources[path] = None
            continue
        digest, seed, source = first.setdefault(record.model, (record.config_sha256, record.seed, path))
        if digest != record.config_sha256:
            raise SeqrecError(f"{record.model} seed {seed} in {source} and seed {record.seed} in {path} were made "
                              f"with different configs (sha256 {digest[:12]} against {record.config_sha256[:12]}); "
                              "one row must come from one config")
    if unchecked:
        log.warning("runs with no config hash and no run folder (in %s), merged without checking that each "
                    "model's runs share one config: %s", ", ".join(map(str, sources)),
                    "; ".join(f"{model} seeds {', '.join(map(str, seeds))}" for model, seeds in unchecked.items()))


def _complete_rows(runs: Sourced, min_seeds: int) -> Sourced:
    """A table of complete rows only: models with fewer finished seeds are left out, failures too."""
    finished: dict[str, set[int]] = {}
    for _, record in runs:
        if not record.failed:
            finished.setdefault(record.model, set()).add(record.seed)
    keep = {model for model, done in finished.items() if len(done) >= min_seeds}
    dropped = sorted({r.model for _, r in runs} - keep)
    if dropped:
        log.info("left out (fewer than %d finished seeds): %s", min_seeds, ", ".join(dropped))
    return [(path, r) for path, r in runs if r.model in keep and not r.failed]


def _merged_meta(payloads: Sequence[tuple[Path, BenchResults]], out: Path, remarks: Sequence[str], min_seeds: int,
                 models: Sequence[str]) -> BenchMeta:
    first = payloads[0][1]
    commands = "`; `".join(p.command for _, p in payloads)
    command = (f"{commands}`, merged by `seqrec bench merge "
               + " ".join(f"--from {path.parent}" for path, _ in payloads)
               + (f" --min-seeds {min_seeds}" if min_seeds else "")
               + (f" --models {','.join(models)}" if models else "") + f" --out {out}")
    return BenchMeta(
        **{key: getattr(first, key) for key in MERGE_KEYS}, data=first.data,
        seeds=list(dict.fromkeys(seed for _, p in payloads for seed in p.seeds)),
        models_requested=[m for _, p in payloads for m in p.models_requested], command=command,
        sources=[str(path) for path, _ in payloads],
        # the sources' own remarks stay: a caveat about some rows must survive later merges
        remarks=list(dict.fromkeys([*(r for _, p in payloads for r in p.remarks or []), *remarks])))


def merge_results(sources: Sequence[Path], out: Path, remarks: Sequence[str] = (),
                  min_seeds: int = 0, models: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One table from several `seqrec bench` outputs on the same data (e.g. models run on different days).

    The per-run records are taken as they are (nothing is retrained or re-measured); sources must agree
    on the dataset, its size and the quick-comparison limits, no (model, seed) run may appear twice, and
    the runs of one model must share one config (``config_sha256``; see ``_check_one_config_per_model``).
    ``models``: only these models' runs (the others are ignored, duplicates included). The resolved
    configs of the models in the table are copied beside it.
    """
    payloads = _read_sources(sources)
    runs = _collect_runs(payloads, models)
    if min_seeds:
        runs = _complete_rows(runs, min_seeds)
    _check_one_config_per_model(runs)
    records = [record for _, record in runs]
    absent = [m for m in models if m not in {r.model for r in records}]
    if absent:
        raise SeqrecError(f"no {'complete ' if min_seeds else ''}runs of {', '.join(absent)} in the sources")
    if not records:  # an empty table written with exit 0 before
        raise SeqrecError(f"no model has {min_seeds} finished seeds in the sources; lower --min-seeds" if min_seeds
                          else "the sources hold no runs")
    meta = _merged_meta(payloads, out, remarks, min_seeds, models)
    out.mkdir(parents=True, exist_ok=True)
    kept = {r.model for r in records}
    for path, _ in payloads:
        configs = path.parent / "configs"
        if configs.is_dir() and configs.resolve() != (out / "configs").resolve():
            (out / "configs").mkdir(exist_ok=True)
            for config in configs.glob("*.yaml"):
                if config.stem in kept:
                    shutil.copy2(config, out / "configs" / config.name)
    return write_results(out, records, meta)

