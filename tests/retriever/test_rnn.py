"""GRU4Rec and LSTM: left alignment by hand, and padded batches against each history run alone."""

import warnings
from typing import Any

import pytest
import torch

from retriever.backbones.rnn import LSTM, GRU4Rec, GRU4RecConfig, LSTMConfig, left_align, restore_alignment

N_ITEMS = 20
MODELS: dict[str, tuple[type, type[torch.nn.Module]]] = {
    "gru4rec": (GRU4RecConfig, GRU4Rec),
    "lstm": (LSTMConfig, LSTM),
}


def _model(name: str, **changes: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    config_cls, model_cls = MODELS[name]
    return model_cls(config_cls(n_items=N_ITEMS, **{"d_model": 8, "n_layers": 2, **changes})).eval()


def test_left_align_moves_only_leading_padding() -> None:
    ids = torch.tensor([[0, 0, 3, 4], [5, 6, 7, 8], [0, 0, 0, 0], [0, 9, 0, 2]])
    aligned, shift = left_align(ids)
    assert aligned.tolist() == [[3, 4, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0], [9, 0, 2, 0]]
    assert shift.tolist() == [2, 0, 0, 1]
    back = restore_alignment(aligned.unsqueeze(-1).float(), shift).squeeze(-1)  # (B, T, 1) -> (B, T)
    assert torch.equal(back.long(), ids)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("hidden_size", [None, 12])
def test_a_padded_batch_matches_each_history_run_alone(name: str, hidden_size: int | None) -> None:
    model = _model(name, hidden_size=hidden_size)
    histories = [[3, 1, 4, 1, 5, 9], [2, 6], [5, 3, 5], [8]]
    T = 8
    batch = torch.tensor([[0] * (T - len(h)) + h for h in histories])
    out = model(batch)
    assert out.shape == (4, T, 8)
    for row, history in enumerate(histories):
        alone = model(torch.tensor([history]))[0]  # (len, D), no padding at all
        assert torch.allclose(out[row, T - len(history):], alone, atol=1e-6)
        assert torch.equal(out[row, : T - len(history)], torch.zeros(T - len(history), 8))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_projection_only_when_the_hidden_size_differs(name: str) -> None:
    same, wider = _model(name), _model(name, hidden_size=12)
    assert isinstance(same.proj, torch.nn.Identity)
    assert isinstance(wider.proj, torch.nn.Linear)
    assert wider.proj.in_features == 12


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_single_layer_with_dropout_builds_without_warnings(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _model(name, n_layers=1, dropout=0.3)


def test_lstm_forget_gate_starts_open() -> None:
    model = _model("lstm", hidden_size=5)
    for layer in range(2):
        bias = getattr(model.lstm, f"bias_ih_l{layer}")
        assert torch.equal(bias[5:10], torch.ones(5))  # gates are ordered input, forget, cell, output
