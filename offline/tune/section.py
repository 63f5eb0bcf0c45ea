"""The pipeline config's ``tune:`` section (light: the pipeline config loads it without Optuna or torch)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Clock = Literal["wall", "cpu"]


class TuneSection(BaseModel):
    """The pipeline config's ``tune:`` section: search within a budget before the retriever is trained."""

    model_config = ConfigDict(extra="forbid")

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
