"""The records `seqrec bench` writes: one per (model, seed) run, and what results.json says about them all.

results.json on disk keeps the shape it always had (``{**meta, "models": rows, "runs": records}``);
these models read it, check it, and write it back with the keys each record had (``dump``), so files
written before these models existed merge as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from retriever.errors import SeqrecError, validation_message

Number = int | float  # as JSON has it: an int stays an int, so a rewritten file is byte for byte the same


class RunRecord(BaseModel):
    """One (model, seed) run: where it is, what it measured, or the error that ended it."""

    model_config = ConfigDict(extra="allow")  # keys added by later versions pass through unchanged

    model: str
    seed: int
    run: str | None = None  # the run folder (OUT/runs/<model>/seed<seed>)
    backbone: str | None = None
    version: str | None = None
    max_len: int | None = None
    params: int | None = None
    flops: Number | None = None  # per sequence, one forward over max_len items
    inference_ms: Number | None = None
    average_steps: Number | None = None  # adaptive-depth encoders only
    seconds_per_epoch: Number | None = None
    best_epoch: int | None = None
    epochs_run: int | None = None
    seconds_to_best: Number | None = None
    seconds: Number | None = None
    sequences_per_second: Number | None = None
    torch_threads: int | None = None
    valid: dict[str, Number] | None = None
    test: dict[str, Number] | None = None
    error: str | None = None  # "Type: message" of what failed; nothing above it was measured then

    @property
    def failed(self) -> bool:
        return self.error is not None

    def dump(self) -> dict[str, Any]:
        """JSON-ready, with exactly the keys this record was given."""
        return self.model_dump(mode="json", exclude_unset=True)


class BenchMeta(BaseModel):
    """What a results.json says about its runs: the data, the seeds, the limits and how it was made."""

    model_config = ConfigDict(extra="allow")

    dataset: str | None = None
    users: int | None = None
    items: int | None = None
    max_epochs: int | None = None
    budget_minutes: Number | None = None
    infer_batch: int = 256
    data: str | None = None
    seeds: list[int] = []
    models_requested: list[str] = []
    command: str = ""
    sources: list[str] | None = None  # merged tables: the results.json files they came from
    remarks: list[str] | None = None  # paragraphs for the table's text, kept through later merges

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class BenchResults(BenchMeta):
    """A whole results.json: its meta, the summary rows and every run."""

    models: list[dict[str, Any]] = []
    runs: list[RunRecord] = []


def read_results(path: Path) -> BenchResults:
    """A results.json, checked; a SeqrecError names the file and what is wrong in it."""
    try:
        return BenchResults.model_validate_json(path.read_text())
    except OSError as err:
        raise SeqrecError(f"cannot read {path}: {err}") from None
    except ValidationError as err:
        raise SeqrecError(f"cannot read {path}: {validation_message(err)}") from None
