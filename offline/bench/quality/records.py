"""The records `seqrec bench` writes: one per (model, seed) run, and what results.json says about them all.

results.json on disk keeps the shape it always had (``{**meta, "models": rows, "runs": records}``);
these models read it, check it, and write it back with the keys each record had (``dump``), so files
written before these models existed merge as they are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from common.errors import SeqrecError, validation_message

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
    config_sha256: str | None = None  # see config_sha256(); absent from records written before it existed

    @property
    def failed(self) -> bool:
        return self.error is not None

    def dump(self) -> dict[str, Any]:
        """JSON-ready, with exactly the keys this record was given."""
        return self.model_dump(mode="json", exclude_unset=True)


# Keys `seqrec train` adds to the stored model section from the data (offline/jobs/train.py); the data
# itself is checked apart (merge refuses sources on other data), so they are not part of the config.
DATA_DERIVED_MODEL_KEYS = ("n_features", "features_per_item")


def config_sha256(config: Mapping[str, Any], source: str = "config") -> str:
    """sha256 of a run config as it trains, without its seed: canonical JSON (sorted keys, no spaces).

    Read through today's schema first, so a key added since (with its default) or a run folder's
    config.json (with the data-derived model keys) hashes as the config the bench resolved.
    """
    from retriever.config import config_from_dict

    resolved = config_from_dict(config, source=source).model_dump(mode="json")
    resolved["train"].pop("seed", None)
    for key in DATA_DERIVED_MODEL_KEYS:
        resolved["model"].pop(key, None)
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
