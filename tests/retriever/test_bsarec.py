"""BSARec: the filter's matrix form, batch-width independence, and one target per training window."""

import pytest
import torch

from retriever.backbones.bsarec import BSARec, BSARecConfig, low_pass_matrix
from retriever.config import ConfigError, config_from_dict
from retriever.losses import LossContext
from retriever.train import BatchLoss


def test_low_pass_matrix_is_the_authors_rfft_irfft_pair() -> None:
    x = torch.randn(4, 50, 8, dtype=torch.float64)
    spectrum = torch.fft.rfft(x, dim=1, norm="ortho")
    spectrum[:, 3:] = 0  # c = 5 keeps 5 // 2 + 1 = 3 frequencies
    expected = torch.fft.irfft(spectrum, n=50, dim=1, norm="ortho")
    assert torch.allclose(low_pass_matrix(50, 3).double() @ x, expected, atol=1e-6)


def test_keeping_every_frequency_is_the_identity() -> None:
    assert torch.allclose(low_pass_matrix(7, 4), torch.eye(7), atol=1e-6)


def test_the_user_vector_does_not_depend_on_the_batch_width_or_on_history_beyond_max_len() -> None:
    torch.manual_seed(0)
    model = BSARec(BSARecConfig(n_items=30, max_len=6, d_model=16)).eval()
    short = torch.tensor([[0, 0, 3, 4, 5]])
    wide = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 3, 4, 5]])
    assert torch.equal(model.encode_last(short), model.encode_last(wide))
    long = torch.tensor([[9, 8, 7, 1, 2, 3, 4, 5, 6]])
    assert torch.equal(model.encode_last(long), model.encode_last(long[:, -6:]))


def test_the_filter_is_not_causal_so_an_earlier_state_sees_later_items() -> None:
    torch.manual_seed(0)
    model = BSARec(BSARecConfig(n_items=30, max_len=6, d_model=16)).eval()
    a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 3, 9]])
    assert not torch.allclose(model(a)[:, 1], model(b)[:, 1])
    assert not BSARec.causal
    assert BSARec.trains_on_prefixes


def test_bsarec_trains_on_prefixes_by_default_and_refuses_other_windows() -> None:
    assert config_from_dict({"model": {"backbone": "bsarec"}}).train.windows == "prefixes"
    with pytest.raises(ConfigError, match=r"train\.windows: prefixes"):
        config_from_dict({"model": {"backbone": "bsarec"}, "train": {"windows": "all"}})
    assert config_from_dict({"model": {"backbone": "transformer"}}).train.windows == "all"


def test_prefix_windows_train_the_last_position_only() -> None:
    """Under windows: prefixes the loss is the cross-entropy of each window's last target alone."""
    config = config_from_dict({"model": {"backbone": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2,
                                         "dropout": 0.0, "emb_dropout": 0.0},
                               "loss": {"name": "full"}, "train": {"windows": "prefixes"}})
    torch.manual_seed(0)
    model = config.build(20).eval()
    ctx = LossContext(temperature=model.temperature, project=model._project)
    batch = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    loss = BatchLoss(model, config, ctx)(batch)
    hidden = model.hidden(batch[:, :-1])[:, -1]
    logits = hidden @ model.item_vectors()[1:].T / model.temperature
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits, batch[:, -1] - 1), atol=1e-6)
