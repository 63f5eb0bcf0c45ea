"""A `seqrec pipeline` config (the YAML file `load_pipeline_config` reads): what data, which retriever config and
overrides, an optional search (`tune:`), the index, the ranker, how many versions to keep; checked when it loads,
before any stage runs."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.errors import SeqrecError, validation_message
from offline.data.protocols import DEFAULT_TEST_CUT, DEFAULT_VALID_CUT
from offline.data.readers import READER_OPTIONS, check_dataset
from offline.tune.section import TuneSection
from ranker.config import RankerSection
from retriever.config import read_yaml

if TYPE_CHECKING:
    from offline.data.temporal import TemporalProtocol


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSpec(_Strict):
    """The dataset and how `seqrec prepare` reads and filters it."""

    dataset: str = Field(description="reader name, as `seqrec prepare --dataset`")
    path: Path | None = Field(None, description="source files (relative to the config file)")
    download: bool = Field(False, description="MovieLens: fetch from GroupLens, verify the MD5")
    min_user_interactions: int = Field(3, description="drop users with fewer (at least 3: training, validation, test)")
    k_core: int | None = Field(None, description="iteratively keep users and items with at least this many")
    min_rating: float | None = Field(None, description="drop interactions rated below this")
    synthetic: dict[str, Any] = Field(default_factory=dict, description="n_users, n_items, mean_length, seed")
    reader: dict[str, Any] = Field(default_factory=dict, description="csv options: user_col, item_col, ...")

    @field_validator("dataset")
    @classmethod
    def _known_reader(cls, name: str) -> str:  # at load, not at the prepare stage
        try:
            check_dataset(name)
        except SeqrecError as err:
            raise ValueError(str(err)) from None
        return name

    @field_validator("reader")
    @classmethod
    def _reader_options(cls, reader: dict[str, Any]) -> dict[str, Any]:  # were internal errors at the prepare stage
        nullable = {option.name: option.nullable for option in READER_OPTIONS}  # may each be null
        unknown = sorted(set(reader) - set(nullable))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}; a reader takes {', '.join(nullable)}")
        for key, value in reader.items():
            if not isinstance(value, str) and not (value is None and nullable[key]):
                raise ValueError(f"{key} must be {'a string or null' if nullable[key] else 'a string'}, "
                                 f"got {value!r}")
        if "sep" in reader:
            from offline.data.readers.tabular import check_sep

            try:
                check_sep(reader["sep"])
            except SeqrecError as err:
                raise ValueError(str(err).replace("--sep", "sep")) from None
        return reader

    @field_validator("synthetic")
    @classmethod
    def _synthetic_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        from offline.data.readers.synthetic import SyntheticConfig

        known = [f.name for f in dataclasses.fields(SyntheticConfig)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}; the synthetic data takes {', '.join(known)}")
        try:
            SyntheticConfig(**options)
        except (TypeError, ValueError) as err:
            raise ValueError(str(err)) from None
        return options


class SplitSection(_Strict):
    """The evaluation protocol the pipeline trains, mines, selects and evaluates under (docs/temporal.md)."""

    protocol: Literal["loo", "temporal"] = Field("loo", description="loo: leave-one-out (the default); temporal: "
                                                 "one validation and one test cut in time for every user")
    valid_cut: str = Field(DEFAULT_VALID_CUT, description="temporal: the validation cut, a quantile of the "
                           "interaction times in (0, 1) or an ISO date")
    test_cut: str = Field(DEFAULT_TEST_CUT, description="temporal: the test cut, a quantile or an ISO date")

    @field_validator("valid_cut", "test_cut", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:  # YAML reads 0.8 as a number; the cut is kept as given, as the CLI's
        return str(value) if isinstance(value, int | float) else value

    def temporal(self) -> TemporalProtocol | None:
        from offline.data.temporal import TemporalProtocol

        return TemporalProtocol(self.valid_cut, self.test_cut) if self.protocol == "temporal" else None


class PipelineConfig(_Strict):
    name: str = Field(description="names the published versions")
    data: DataSpec
    retriever: Path | None = Field(None, description="run config YAML of the retriever (relative to this file); "
                                   "none: retriever/config.py's defaults (with `tune:`, where the search starts)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="section.key: value for the retriever")
    tune: TuneSection | None = Field(None, description="search the retriever config first (`seqrec tune`)")
    index: Literal["auto", "flat", "hnsw", "ivf"] = Field("auto", description="the FAISS index (auto: exact up to "
                                                          "200K items, HNSW beyond)")
    ranker: RankerSection = Field(default_factory=RankerSection)
    split: SplitSection | None = Field(None, description="the evaluation protocol (none: leave-one-out); "
                                       "`seqrec pipeline --protocol/--valid-cut/--test-cut` override it")
    budget_minutes: float | None = Field(
        None, description="publish within this many minutes (plus 10 %): the stages are planned from a probe of "
        "the retriever's costs, and what does not fit shrinks (offline/jobs/budget.py)")
    keep: int = Field(3, ge=1, description="published versions to keep")
    warm_start: bool = Field(False, description="train from the served bundle's weights (`seqrec train --init-from`)")
    warm_start_overrides: dict[str, Any] = Field(default_factory=dict,
                                                 description="section.key: value added when warm-starting")

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str) -> str:  # it names the run's work folder: no separators, no `..`
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"{name!r} names folders: use letters, digits, '.', '_' and '-', starting with a "
                             "letter or digit")
        return name


def temporal_protocol(config: PipelineConfig) -> TemporalProtocol | None:
    """The temporal protocol a pipeline runs under, or None for leave-one-out."""
    return None if config.split is None else config.split.temporal()


def with_split(config: PipelineConfig, given: dict[str, str]) -> PipelineConfig:
    """``config`` with the command line's --protocol, --valid-cut and --test-cut (``given``: those passed) over
    its ``split:`` section; a cut under leave-one-out is refused (it would be ignored)."""
    if not given:
        return config
    merged = {**({} if config.split is None else config.split.model_dump()), **given}
    if merged.get("protocol", "loo") != "temporal":
        cuts = [f"--{key.replace('_', '-')}" for key in ("valid_cut", "test_cut") if key in given]
        if cuts:
            raise SeqrecError(f"{', '.join(cuts)} applies to --protocol temporal, not to leave-one-out")
        return config.model_copy(update={"split": None})
    return config.model_copy(update={"split": SplitSection.model_validate(merged)})


def load_pipeline_config(path: Path) -> PipelineConfig:
    raw = read_yaml(path, "pipeline config")
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise SeqrecError(f"{path}: {validation_message(err)}") from None
    base = Path(path).resolve().parent
    updates: dict[str, Any] = {} if config.retriever is None else {"retriever": _relative(base, config.retriever)}
    if config.retriever is not None and not updates["retriever"].is_file():  # now, not after the prepare stage
        raise SeqrecError(f"{path}: retriever: no such file {updates['retriever']}")
    data = config.data
    if data.path is not None:
        updates["data"] = data.model_copy(update={"path": _relative(base, data.path)})
    return config.model_copy(update=updates)


def _relative(base: Path, path: Path) -> Path:
    path = Path(os.path.expanduser(path))
    if path.is_absolute():
        return path
    from_file = base / path
    return from_file if from_file.exists() or not path.exists() else path.resolve()  # else: relative to the CWD
