"""The one run config: YAML file -> dotted overrides (CLI or pipeline config) -> validated -> stored in the artifact.

    model:  backbone name, similarity, temperature, and the backbone's own options
    loss:   which loss and its options
    train:  optimiser, schedule, batches, early stopping, seed, device, the repeat policy

Export and the service rebuild the model from the stored config, never from flags.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.errors import RetrieverError, validation_message
from retriever.backbones import BACKBONES, backbone_config, build_encoder
from retriever.losses import LossName
from retriever.model import Retriever, Similarity


class ConfigError(RetrieverError):
    """A config file or override that cannot be used; the message says which key and why."""


# The ID part an item added without retraining gets (`service.system.catalog`): this times the mean ID row of the
# trained items sharing its feature values. Chosen on Beauty's validation users (docs/results/cold-calibration): the
# best cold NDCG@10 with the new items in at most 1.5 x their catalogue share of other users' top-10 slots; 0, a
# vector of feature embeddings alone, put 5% of the catalogue in 69% of those slots.
ADDED_ID_WEIGHT = 1.1


class ModelConfig(BaseModel):
    """Backbone-specific options (d_model, n_layers, max_len, ...) sit beside these keys."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    backbone: str = Field("transformer", description="the encoder: a name of retriever/backbones' BACKBONES")
    similarity: Similarity = Field("cosine", description="score = cos(user, item) / temperature, or their dot "
                                   "product (dot: the FAISS index holds the raw vectors)")
    temperature: float = Field(0.05, gt=0, description="the scores are the similarity divided by this (a softmax "
                               "temperature)")
    item_features: str | None = Field(
        None, description="items.parquet column of side features (e.g. attributes, genres) added to item vectors"
    )
    added_id_weight: float = Field(
        ADDED_ID_WEIGHT, ge=0, description="ID part of an item added without retraining, as a multiple of the mean "
        "ID row of the trained items sharing its feature values (serving only: training ignores it)"
    )

    def backbone_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class LossConfig(BaseModel):
    """The training loss (retriever/losses.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: LossName = Field("infonce", description="infonce: in-batch negatives; sampled: softmax over n_negatives "
                           "uniform items; full: softmax over every item; bce: one negative per position")
    logq: bool = Field(False, description="infonce: subtract each candidate's log chance of being in the batch")
    n_uniform: int = Field(0, ge=0, description="extra uniform negatives mixed into infonce")
    n_negatives: int = Field(256, ge=1, description="uniform negatives of the sampled softmax")


Beta = Annotated[float, Field(ge=0, lt=1)]  # Adam's moment decay


class TrainConfig(BaseModel):
    """The optimiser, the schedule, batches, early stopping, the seed, the device and the repeat policy."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    batch_size: int = Field(128, ge=1, description="sequences per step")
    lr: float = Field(1e-3, gt=0, description="AdamW's learning rate (the peak, after the warmup)")
    betas: tuple[Beta, Beta] = Field((0.9, 0.98), description="AdamW's moment decays")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay")
    warmup_steps: int = Field(100, ge=0, description="steps of linear warmup to train.lr")
    schedule: Literal["constant", "cosine", "wsd"] = Field(
        "constant", description="constant; cosine: to 0 at train.epochs; wsd: warmup-stable-decay, the decay "
        "started by a validation plateau (no gain for decay_patience evaluations), training ends with it")
    decay_patience: int = Field(3, ge=1, description="wsd: evaluations without a gain that start the decay")
    decay_fraction: float = Field(
        0.25, gt=0, le=1, description="wsd: the decay lasts this fraction of the epochs run before it (rounded up)")
    lr_floor: float = Field(0.0, ge=0, lt=1, description="wsd: the lr the decay ends at, as a fraction of train.lr")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradients' global norm to this (None: never)")
    epochs: int = Field(200, ge=1, description="upper bound; early stopping usually ends sooner")
    eval_every: int = Field(1, ge=1, description="epochs between validation runs")
    patience: int = Field(10, ge=1, description="validation runs without improvement before stopping")
    budget_minutes: float | None = Field(
        None, gt=0, description="wall-clock cap: stop after the epoch that crosses it, keep the best epoch"
    )
    windows: Literal["all", "last", "prefixes"] = Field(
        "all", description="all: cut long sequences into max_len windows; last: only the most recent one; "
        "prefixes: one window ending at every training target, trained at its last position only (the default "
        "and only choice for encoders whose states are not causal, e.g. BSARec; costs about the mean sequence "
        "length times more)")
    ema_epochs: float | None = Field(
        None, gt=0, description="validate, select and export an exponential moving average of the weights whose "
        "horizon is this many epochs (None: the weights as trained)")
    seed: int = Field(42, description="seeds the weights, the batches and the sampled negatives")
    repeats: Literal["auto", "exclude", "allow"] = Field(
        "auto", description="may history items be recommended: exclude, allow, or auto (from the data's "
        "share of repeat validation targets; see retriever/repeats.py)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when torch sees a GPU")
    threads: int | None = Field(None, ge=1, description="CPU threads (default: torch's choice)")
    eval_batch_size: int | None = Field(None, ge=1, description="users per validation batch (default: by memory)")
    eval_users: int | None = Field(
        None, ge=1, description="validate and report metrics on this many users drawn once (seed train.seed); "
        "None = every user. For very large data: full ranking per user is kept, only users are sampled")

    @model_validator(mode="after")
    def _decay_before_patience(self) -> TrainConfig:
        if self.schedule == "wsd" and self.patience <= self.decay_patience:
            raise ValueError(f"schedule wsd needs patience ({self.patience}) > decay_patience "
                             f"({self.decay_patience}), or the plateau ends training before the decay starts")
        return self


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: ModelConfig = ModelConfig()
    loss: LossConfig = LossConfig()
    train: TrainConfig = TrainConfig()

    def backbone(self, n_items: int) -> Any:
        """The backbone's typed config (validates backbone-specific options)."""
        try:
            return backbone_config(self.model.backbone, n_items, self.model.backbone_params())
        except (TypeError, ValueError) as err:
            raise ConfigError(f"model: {err}") from None

    def build(self, n_items: int) -> Retriever:
        name = self.model.backbone
        try:  # the modules check how their options combine (d_model over n_heads, ...)
            encoder = build_encoder(name, self.backbone(n_items))
        except ValueError as err:
            raise ConfigError(f"model: {err}") from None
        return Retriever(encoder, temperature=self.model.temperature, similarity=self.model.similarity)

    def max_len(self, n_items: int) -> int:
        return int(self.backbone(n_items).max_len)


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read YAML (or start from defaults), apply ``section.key=value`` overrides (the command line's), validate."""
    return config_from_dict(apply_overrides(_read_config(path), overrides), source=str(path or "defaults"))


def load_config_with(path: Path | None, values: Mapping[str, Any]) -> RunConfig:
    """Read YAML (or start from defaults), set ``{"section.key": value}`` (a pipeline config's ``overrides:``, the
    values as its YAML typed them), validate."""
    return config_from_dict(set_values(_read_config(path), values), source=str(path or "defaults"))


def _read_config(path: Path | None) -> dict[str, Any]:
    return {} if path is None else read_yaml(path, "config file")


class _TwiceGiven(Exception):
    pass


class _UniqueKeys(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML leaves it to the reader; PyYAML keeps the
    last, so a second `train:` section silently replaced the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be given again
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _TwiceGiven(f"key {key!r} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (an empty file reads as ``{}``); a missing file, bad YAML
    or a top level that is not a mapping is a one-line `ConfigError` naming ``what``."""
    try:
        loaded = yaml.load(Path(path).read_text(), Loader=_UniqueKeys)  # a SafeLoader
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a folder, not a {what}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    except _TwiceGiven as err:
        raise ConfigError(f"{path}: {err}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping (section: ...) at the top level of the {what}, "
                          f"not a {type(loaded).__name__}")
    return loaded


def config_from_dict(raw: Mapping[str, Any], source: str = "config") -> RunConfig:
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {validation_message(err)}") from None
    if config.model.backbone not in BACKBONES:
        raise ConfigError(f"{source}: unknown backbone {config.model.backbone!r}; "
                          f"choose one of {', '.join(sorted(BACKBONES))}")
    config.backbone(n_items=1)  # backbone-specific keys are checked now, not after loading data
    if BACKBONES[config.model.backbone][1].trains_on_prefixes and config.train.windows != "prefixes":
        if "windows" in config.train.model_fields_set:
            raise ConfigError(f"{source}: backbone {config.model.backbone!r} mixes every position of a window, so "
                              "it trains one target per window: set train.windows: prefixes (its default)")
        config = config.model_copy(update={"train": config.train.model_copy(update={"windows": "prefixes"})})
    return config


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``["train.lr=3e-4", "model.d_model=64"]`` -> a new nested dict; values parsed as YAML."""
    out = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or "." not in key:
            raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.lr=3e-4)")
        _set_key(out, key, _parse_value(text), item)
    return out


def set_values(raw: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"train.lr": 0.0003, "model.d_model": 64}`` -> a new nested dict. A string value is read as the command
    line reads one (`train.lr: 3e-4` is a string to YAML 1.1, and a float here, as `--train.lr 3e-4` is)."""
    out = copy.deepcopy(dict(raw))
    for key, value in values.items():
        if "." not in key:
            raise ConfigError(f"override {key!r} must look like section.key (e.g. train.lr)")
        _set_key(out, key, _parse_value(value) if isinstance(value, str) else copy.deepcopy(value), key)
    return out


def _set_key(out: dict[str, Any], key: str, value: Any, shown: str) -> None:
    """Set the dotted ``key`` of the nested dict ``out`` (``shown``: the override as the user gave it)."""
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {shown!r}: {part!r} is not a section")
        node = child
    node[leaf] = value


def _parse_value(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def parse_cli_overrides(args: Sequence[str]) -> list[str]:
    """``["--train.lr", "3e-4", "--model.d_model=64"]`` -> ``["train.lr=3e-4", "model.d_model=64"]``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(f"unrecognised argument {arg!r}; config overrides look like --train.lr 3e-4")
        if "=" in arg:
            out.append(arg[2:])
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"{arg[2:]}={args[i + 1]}")
            i += 2
        else:
            raise ConfigError(f"override {arg} needs a value")
    return out
