"""The sizing rules (retriever/sizing.py): functions of the data's shape and the device, monotone in the data's size,
and always a valid config."""

from __future__ import annotations

import itertools

import pytest

from retriever.config import load_config_with
from retriever.sizing import DataShape, Device, shrunk, sized_settings

CPU, GPU = Device("cpu", 1), Device("cuda", 8)


def _shape(interactions: int, users: int, items: int, q95: float = 60.0, features: dict | None = None) -> DataShape:
    mean = interactions / users
    return DataShape(interactions=interactions, users=users, items=items, mean_length=mean,
                     length_quantiles={"q50": mean, "q90": q95 * 0.8, "q95": q95}, feature_columns=features or {})


def _values(shape: DataShape, device: Device = CPU) -> dict:
    return {key: s.value for key, s in sized_settings(shape, device).items()}


GROWING = [_shape(n, n // 50, max(100, n // 40), q95=300) for n in (10_000, 100_000, 500_000, 2_000_000, 20_000_000)]


@pytest.mark.parametrize("device", [CPU, GPU])
def test_the_model_grows_and_the_schedule_shortens_with_the_data(device: Device) -> None:
    sized = [_values(s, device) for s in GROWING]
    for small, large in itertools.pairwise(sized):
        assert large["model.d_model"] >= small["model.d_model"]
        assert large["model.n_layers"] >= small["model.n_layers"]
        assert large["train.epochs"] <= small["train.epochs"]
        assert large["model.max_len"] <= small["model.max_len"]  # the attention cost cap
    assert sized[0]["train.epochs"] > sized[-1]["train.epochs"]
    assert sized[0]["loss.name"] == "full"
    assert sized[-1]["loss.name"] == "infonce"


def test_dropout_falls_as_each_item_gets_more_training_interactions() -> None:
    per_item = [_values(_shape(100_000, 1000, items))["model.dropout"] for items in (20_000, 6_000, 1_500, 500)]
    assert per_item == sorted(per_item, reverse=True)
    assert per_item[0] == 0.5
    assert per_item[-1] == 0.1


def test_a_gpu_gets_a_model_at_least_as_large_as_a_cpu() -> None:
    for shape in GROWING:
        cpu, gpu = _values(shape, CPU), _values(shape, GPU)
        assert gpu["model.d_model"] >= cpu["model.d_model"]
        assert gpu["model.max_len"] >= cpu["model.max_len"]
    assert _values(GROWING[-1], GPU)["model.d_model"] > _values(GROWING[-1], CPU)["model.d_model"]


def test_the_window_follows_the_length_distribution() -> None:
    assert _values(_shape(50_000, 5000, 2000, q95=14))["model.max_len"] == 20  # the floor
    assert _values(_shape(50_000, 1000, 2000, q95=43))["model.max_len"] == 50  # rounded up to a multiple of 10
    assert _values(_shape(50_000, 300, 2000, q95=900))["model.max_len"] == 100  # the CPU's cap


def test_side_features_are_the_richest_list_column_when_the_catalogue_has_one() -> None:
    assert "model.item_features" not in _values(_shape(50_000, 1000, 2000))
    chosen = _values(_shape(50_000, 1000, 2000, features={"genres": 18, "tags": 400}))
    assert chosen["model.item_features"] == "tags"


@pytest.mark.parametrize("shape", GROWING)
@pytest.mark.parametrize("device", [CPU, GPU])
def test_every_sized_setting_is_a_valid_run_config(shape: DataShape, device: Device) -> None:
    config = load_config_with(None, _values(shape, device))
    config.build(n_items=shape.items)  # heads divide the width, patience exceeds the decay's
    assert config.train.schedule == "wsd"
    assert config.train.patience > config.train.decay_patience


def test_shrinking_halves_the_window_and_width_and_drops_a_layer_but_never_a_fixed_key() -> None:
    values = {"model.max_len": 100, "model.d_model": 128, "model.n_layers": 2, "model.n_heads": 4}
    assert shrunk(values, set()) == {"model.max_len": 50, "model.d_model": 64, "model.n_layers": 1,
                                     "model.n_heads": 2}
    assert shrunk(values, {"model.d_model", "model.n_heads"}) == {**values, "model.max_len": 50, "model.n_layers": 1}
    floor = {"model.max_len": 10, "model.d_model": 32, "model.n_layers": 1, "model.n_heads": 1}
    assert shrunk(floor, set()) is None
