"""The pipeline config's ``tune:`` section and what a published bundle keeps of the search (light: the
pipeline config loads it without Optuna or torch)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Clock = Literal["wall", "cpu"]


class TuneSection(BaseModel):
    """The pipeline config's ``tune:`` section: search within a budget before the retriever is trained."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    trials: int | None = Field(None, ge=1, description="finished trials to run")
    minutes: float | None = Field(None, gt=0, description="search budget in minutes")
    clock: Clock = Field("wall", description="what minutes count: wall-clock or this process's CPU time")
    seed: int = Field(0, description="the TPE sampler's seed")
    fix: dict[str, Any] = Field(default_factory=dict, description="searched parameters pinned to a value")

    @model_validator(mode="after")
    def _some_budget(self) -> TuneSection:
        if self.trials is None and self.minutes is None:
            raise ValueError("tune needs trials or minutes (or both)")
        return self


REPORT_FILES = ("best.yaml", "trials.md", "trials.csv", "history.png", "result.json")


def keep_report(out: Path, bundle: Path) -> None:
    """Copy a finished search's report from OUT into BUNDLE/tune/, so that it is published with the model the
    search chose (the pipeline deletes its work folder, and with it OUT, once the bundle is published)."""
    if not (out / "best.yaml").exists():
        return
    (bundle / "tune").mkdir(exist_ok=True)
    for name in REPORT_FILES:
        if (out / name).exists():
            shutil.copy2(out / name, bundle / "tune" / name)
