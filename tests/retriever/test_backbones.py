"""The contract every registered backbone keeps: shapes, causality, padding, save -> load,
and a tiny deterministic pattern learned through the shared training loop."""

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from offline.data.sequences import Sequences
from offline.data.split import leave_one_out
from offline.evaluation.evaluate import evaluate_splits
from retriever.artifact import load_artifact, write_artifact
from retriever.backbones import BACKBONES, SequenceEncoder, backbone_config, build_encoder
from retriever.config import config_from_dict
from retriever.model import Retriever
from retriever.train import fit

N_ITEMS = 40

# Small sizes for every backbone; a key is used only where the backbone's config has it.
TINY = {"d_model": 16, "n_layers": 2, "n_heads": 2, "max_len": 12}
# Per-backbone additions (e.g. a smaller ponder cost); keep them to what a tiny model needs.
TINY_EXTRA: dict[str, dict[str, Any]] = {}


def _params(name: str, **changes: Any) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(BACKBONES[name][0])}
    return {k: v for k, v in {**TINY, **TINY_EXTRA.get(name, {}), **changes}.items() if k in fields}


def _encoder(name: str) -> SequenceEncoder:
    torch.manual_seed(0)
    config = backbone_config(name, N_ITEMS, _params(name))
    return build_encoder(name, config).eval()


@pytest.fixture(params=sorted(BACKBONES))
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_shapes(name: str) -> None:
    encoder = _encoder(name)
    ids = torch.randint(1, N_ITEMS + 1, (3, 7))
    assert encoder(ids).shape == (3, 7, 16)
    assert encoder.item_embeddings().shape == (N_ITEMS + 1, 16)
    scores = Retriever(encoder).score(ids)
    assert scores.shape == (3, N_ITEMS + 1)
    assert torch.isinf(scores[:, 0]).all()


def test_causal_changing_item_t_plus_one_leaves_earlier_outputs(name: str) -> None:
    encoder = _encoder(name)
    if not encoder.causal:
        pytest.skip(f"{name} is bidirectional by design")
    ids = torch.randint(1, N_ITEMS + 1, (2, 8))
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] % N_ITEMS) + 1
    a, b = encoder(ids), encoder(changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-5)
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-5)


def test_extra_left_padding_does_not_change_the_user_vector(name: str) -> None:
    model = Retriever(_encoder(name))
    ids = torch.randint(1, N_ITEMS + 1, (2, 5))
    padded = torch.cat([torch.zeros(2, 4, dtype=torch.long), ids], dim=1)
    assert torch.allclose(model.user_vectors(ids), model.user_vectors(padded), atol=1e-5)


def test_unknown_option_is_a_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        backbone_config(name, N_ITEMS, {"d_modle": 16})


@pytest.mark.parametrize(("backbone", "params", "message"), [
    ("transformer", {"d_model": 16.5}, "d_model must be a whole number, got 16.5"),
    ("transformer", {"d_model": "abc"}, "d_model must be a whole number, got 'abc'"),
    ("transformer", {"d_model": None}, "d_model must be a whole number, got None"),  # `--model.d_model=`
    ("transformer", {"d_model": [16]}, "d_model must be a whole number, got [16]"),
    ("transformer", {"n_layers": True}, "n_layers must be a whole number, got True"),  # trained as 1 layer before
    ("gru4rec", {"hidden_size": 8.0}, "hidden_size must be a whole number, got 8.0"),
    ("transformer", {"dropout": "0.1x"}, "dropout must be a number, got '0.1x'"),
    ("transformer", {"dropout": math.nan}, "dropout must be finite, got nan"),
    ("trm4rec", {"adaptive": 1}, "adaptive must be true or false, got 1"),
])
def test_an_option_of_the_wrong_type_names_the_key_and_the_value(backbone: str, params: dict, message: str) -> None:
    # each was a TypeError from torch ("empty(): argument 'size' failed to unpack") or passed as a number
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        backbone_config(backbone, N_ITEMS, params)


def test_options_of_their_declared_types_build() -> None:
    config = backbone_config("trm4rec", N_ITEMS, {"d_model": 16, "dropout": 0, "adaptive": True})
    assert (config.d_model, config.dropout, config.adaptive) == (16, 0, True)
    assert backbone_config("gru4rec", N_ITEMS, {"hidden_size": None}).hidden_size is None


def test_user_vector_shortcut_matches_the_full_forward(name: str) -> None:
    encoder = _encoder(name)
    if not encoder.causal:
        pytest.skip(f"{name} reads the user at an appended mask token; its own tests check encode_last")
    ids = torch.randint(0, N_ITEMS + 1, (4, 9))
    ids[:, -1] = torch.randint(1, N_ITEMS + 1, (4,))
    model = Retriever(encoder)
    full = torch.nn.functional.normalize(encoder(ids)[:, -1], dim=-1)
    assert torch.allclose(model.user_vectors(ids), full, atol=1e-5)


def test_save_load_gives_identical_scores(name: str, tmp_path: Path) -> None:
    config = config_from_dict({"model": {"backbone": name, **_params(name)}})
    torch.manual_seed(0)
    model = config.build(N_ITEMS).eval()
    ids = torch.randint(1, N_ITEMS + 1, (3, 6))
    write_artifact(tmp_path / "a", model, config, np.array([f"i{i}" for i in range(N_ITEMS)]))
    loaded = load_artifact(tmp_path / "a", with_index=False).model
    with torch.no_grad():
        assert torch.equal(model.score(ids), loaded.score(ids))


def _cycle(n_users: int = 200, n_items: int = 30, length: int = 10) -> Sequences:
    rng = np.random.default_rng(0)
    starts = rng.integers(0, n_items, n_users)
    return Sequences.from_lists([[(s + t) % n_items + 1 for t in range(length)] for s in starts])


def test_learns_a_deterministic_cycle(name: str, tmp_path: Path) -> None:
    """Next item = current item + 1 (mod 30): every backbone must learn it through the shared loop."""
    split = leave_one_out(_cycle())
    raw = {
        "model": {"backbone": name, **_params(name, d_model=32, n_layers=1, max_len=8), "dropout": 0.0},
        "loss": {"name": "full"},
        "train": {"batch_size": 32, "lr": 0.01, "warmup_steps": 5, "epochs": 25, "patience": 25, "seed": 0,
                  "threads": 1},
    }
    fields = {f.name for f in dataclasses.fields(BACKBONES[name][0])}
    raw["model"] = {k: v for k, v in raw["model"].items() if k in fields or k == "backbone"}
    config = config_from_dict(raw)

    def validate(model: Retriever) -> dict[str, float]:
        return evaluate_splits(model.score, split, 30, splits=("valid",), max_len=8)["valid"]

    result = fit(config, split.train.offsets, split.train.items, 30, validate, tmp_path, progress=False)
    assert evaluate_splits(result.model.score, split, 30, max_len=8)["test"]["HR@10"] >= 0.9


def test_item_features_are_added_to_both_sides() -> None:
    from retriever.backbones.transformer import Transformer, TransformerConfig

    config = TransformerConfig(n_items=4, max_len=5, d_model=8, n_layers=1, n_heads=2, n_features=3,
                               features_per_item=2)
    encoder = Transformer(config).eval()
    encoder.set_item_features(torch.tensor([[0, 0], [1, 2], [1, 2], [3, 0], [0, 0]]))
    with torch.no_grad():
        encoder.item_emb.weight.zero_()
    table = encoder.item_embeddings()
    features = encoder.feature_emb.weight  # type: ignore[union-attr]
    assert torch.allclose(table[1], (features[1] + features[2]) / 2)
    assert torch.allclose(table[1], table[2])  # same features, no ID signal: same vector
    assert torch.allclose(table[3], features[3])
    assert torch.equal(table[0], torch.zeros(8))
    assert torch.equal(table[4], torch.zeros(8))  # an item without features keeps its ID embedding alone
    ids = torch.tensor([[0, 3, 1, 4], [2, 2, 0, 1]])
    assert torch.allclose(encoder.embed(ids), table[ids])  # the per-request path reads the same rows
    with pytest.raises(ValueError, match="shaped"):
        encoder.set_item_features(torch.zeros(5, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="feature ids"):
        encoder.set_item_features(torch.full((5, 2), 4))
