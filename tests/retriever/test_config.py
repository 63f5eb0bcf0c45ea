from pathlib import Path

import pytest

from retriever.config import (
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
    load_config_with,
    parse_cli_overrides,
    set_values,
)
from retriever.repeats import REPEAT_THRESHOLD, resolve_repeats

CONFIGS = sorted(p for p in (Path(__file__).parents[2] / "configs").glob("*/*.yaml")
                 if p.parent.name != "pipeline")  # pipeline configs: tests/offline/jobs/test_pipeline.py


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.name}" for p in CONFIGS])
def test_every_committed_config_loads_and_builds(path: Path) -> None:
    config = load_config(path)
    model = config.build(n_items=10)
    assert config.max_len(10) >= 1
    assert model.temperature == config.model.temperature


def test_committed_configs_exist_for_the_reference_datasets() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in CONFIGS}
    assert {"ml-100k/transformer.yaml", "beauty/transformer.yaml", "ml-1m/transformer.yaml",
            "ml-20m/transformer.yaml"} <= names


def test_the_reference_retriever_settings_for_movielens() -> None:
    for name in ("ml-1m", "ml-20m"):
        config = load_config(Path(__file__).parents[2] / "configs" / name / "transformer.yaml")
        params = config.model.backbone_params()
        assert (params["d_model"], params["n_layers"], params["n_heads"], params["dropout"]) == (256, 4, 8, 0.1)
        assert config.model.temperature == 0.05
        assert config.train.betas == (0.9, 0.98)
        assert config.train.weight_decay == 0.0
        assert config.loss.name == "infonce"


def test_overrides_are_typed_and_nested() -> None:
    raw = apply_overrides({"train": {"lr": 1.0}}, ["train.lr=3e-4", "model.d_model=32", "loss.logq=true"])
    assert raw == {"train": {"lr": 3e-4}, "model": {"d_model": 32}, "loss": {"logq": True}}
    assert parse_cli_overrides(["--train.lr", "3e-4", "--model.d_model=32"]) == ["train.lr=3e-4", "model.d_model=32"]


def test_a_pipeline_configs_overrides_are_set_as_typed() -> None:
    """A pipeline config's `overrides:` reach the run config as its YAML typed them, without a trip through
    `key=value` strings; a string is read as the command line reads one (YAML 1.1 reads 3e-4 as a string)."""
    values = {"train.lr": "3e-4", "train.grad_clip": None, "train.betas": [0.8, 0.9], "model.item_features": None,
              "train.schedule": "wsd", "model.d_model": 32, "loss.logq": True}
    raw = set_values({"train": {"lr": 1.0, "epochs": 2}}, values)
    assert raw == {"train": {"lr": 3e-4, "epochs": 2, "grad_clip": None, "betas": [0.8, 0.9], "schedule": "wsd"},
                   "model": {"item_features": None, "d_model": 32}, "loss": {"logq": True}}
    assert raw == apply_overrides({"train": {"lr": 1.0, "epochs": 2}},
                                  ["train.lr=3e-4", "train.grad_clip=null", "train.betas=[0.8, 0.9]",
                                   "model.item_features=null", "train.schedule=wsd", "model.d_model=32",
                                   "loss.logq=true"])
    config = load_config_with(None, values)
    assert (config.train.lr, config.train.grad_clip, config.train.betas) == (3e-4, None, (0.8, 0.9))
    with pytest.raises(ConfigError, match=r"override 'lr' must look like section.key \(e.g. train.lr\)"):
        set_values({}, {"lr": 1})
    with pytest.raises(ConfigError, match=r"override 'train\.lr\.x': 'lr' is not a section"):
        set_values({"train": {"lr": 1.0}}, {"train.lr.x": 1})
    with pytest.raises(ConfigError, match=r"defaults: .*train\.typo"):
        load_config_with(None, {"train.typo": 1})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--lr", "1"], "unrecognised argument"),
        (["--train.lr"], "needs a value"),
    ],
)
def test_bad_cli_overrides(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cli_overrides(overrides)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"train": {"lr": 0}}, "train.lr"),
        ({"train": {"typo": 1}}, "train.typo"),
        ({"model": {"backbone": "nope"}}, "unknown backbone"),
        ({"model": {"d_modle": 8}}, "d_modle"),
        ({"loss": {"name": "hinge"}}, "loss.name"),
        ({"model": {"d_model": -5}}, "model: d_model must be >= 1, got -5"),
        ({"model": {"max_len": 0}}, "model: max_len must be >= 1, got 0"),
        ({"model": {"backbone": "sasrec", "n_layers": 0}}, "model: n_layers must be >= 1, got 0"),
        ({"model": {"backbone": "gru4rec", "hidden_size": 0}}, "model: hidden_size must be >= 1, got 0"),
    ],
)
def test_bad_configs_name_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


@pytest.mark.parametrize(("model", "message"), [
    ({"backbone": "transformer", "d_model": 64, "n_heads": 3}, "model: d_model 64 is not divisible by n_heads 3"),
    ({"backbone": "sasrec", "d_model": 64, "n_heads": 3}, "model: d_model 64 is not divisible by n_heads 3"),
    ({"backbone": "trm4rec", "n_steps": 0}, "model: n_steps and n_blocks must be >= 1"),
    ({"backbone": "xlstm", "n_heads": 3}, "is not divisible by n_heads 3"),
])
def test_options_a_module_cannot_combine_are_config_errors_when_it_is_built(model: dict, message: str) -> None:
    config = config_from_dict({"model": model})
    with pytest.raises(ConfigError, match=message):
        config.build(n_items=10)


@pytest.mark.parametrize(("requested", "valid_share", "policy"), [
    ("auto", 0.0, "exclude"),  # Beauty, ML-100K: no repeat targets
    ("auto", REPEAT_THRESHOLD, "exclude"),  # at the threshold: still exclude
    ("auto", 0.067, "allow"),  # re-consumption data
    ("auto", 0.44, "allow"),  # the demo's synthetic data
    ("exclude", 0.44, "exclude"),  # an explicit choice wins over the data
    ("allow", 0.0, "allow"),
])
def test_the_repeat_policy_follows_the_validation_share_only_under_auto(requested: str, valid_share: float,
                                                                       policy: str) -> None:
    assert resolve_repeats(requested, valid_share) == policy


def test_the_repeat_policy_is_a_checked_train_key() -> None:
    assert load_config(None).train.repeats == "auto"
    assert load_config(None, ["train.repeats=allow"]).train.repeats == "allow"
    with pytest.raises(ConfigError, match="repeats"):
        load_config(None, ["train.repeats=sometimes"])
    with pytest.raises(ValueError, match="sometimes"):
        resolve_repeats("sometimes", 0.5)
