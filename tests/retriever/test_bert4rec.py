"""BERT4Rec: the mask token, the cloze inputs, and inference at an appended mask."""

import pytest
import torch
import torch.nn.functional as F

from retriever.backbones.bert4rec import BERT4Rec, BERT4RecConfig
from retriever.model import Retriever

N_ITEMS = 20
MASK = N_ITEMS + 1


def _encoder(**changes: float) -> BERT4Rec:
    torch.manual_seed(0)
    params = {"max_len": 8, "d_model": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.0, **changes}
    config = BERT4RecConfig(n_items=N_ITEMS, **params)  # type: ignore[arg-type]
    return BERT4Rec(config).eval()


def test_item_table_leaves_out_the_mask_token() -> None:
    encoder = _encoder()
    assert encoder.item_emb.weight.shape == (N_ITEMS + 2, 16)
    assert torch.equal(encoder.item_embeddings(), encoder.item_emb.weight[: N_ITEMS + 1])
    assert encoder(torch.tensor([[0, 3, MASK]])).shape == (1, 3, 16)  # the mask id is a valid input


def test_encode_last_is_forward_with_a_mask_appended() -> None:
    encoder = _encoder()
    ids = torch.tensor([[0, 0, 0, 4, 7, 9], [1, 2, 3, 4, 5, 6]])
    with_mask = torch.cat([ids, torch.full((2, 1), MASK)], dim=1)
    assert torch.allclose(encoder.encode_last(ids), encoder(with_mask)[:, -1], atol=1e-5)
    expected = F.normalize(encoder(with_mask)[:, -1], dim=-1)
    assert torch.allclose(Retriever(encoder).user_vectors(ids), expected, atol=1e-5)


def test_encode_last_drops_the_oldest_item_to_make_room_for_the_mask() -> None:
    encoder = _encoder()  # max_len 8
    ids = torch.arange(1, 11).unsqueeze(0)  # 10 items
    expected = encoder(torch.cat([ids[:, -7:], torch.tensor([[MASK]])], dim=1))[:, -1]
    assert torch.allclose(encoder.encode_last(ids), expected, atol=1e-5)
    assert torch.allclose(encoder.encode_last(ids), encoder.encode_last(ids[:, -7:]), atol=1e-5)


def test_every_position_sees_later_items() -> None:
    encoder = _encoder()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    changed = ids.clone()
    changed[0, 4] = 9
    assert not torch.allclose(encoder(ids)[:, 0], encoder(changed)[:, 0], atol=1e-5)
    assert BERT4Rec.causal is False


def test_left_padding_leaves_real_positions_unchanged() -> None:
    encoder = _encoder()
    ids = torch.tensor([[3, 1, 4, MASK]])
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    assert torch.allclose(encoder(ids), encoder(padded)[:, 3:], atol=1e-5)


def test_cloze_inputs_mask_real_items_and_target_their_ids() -> None:
    encoder = _encoder(mask_prob=0.5, last_item_prob=0.0)
    batch = torch.randint(1, N_ITEMS + 1, (64, 9))
    batch[:32, :4] = 0  # left padding
    inputs, targets, trained = encoder.training_inputs(batch, torch.Generator().manual_seed(0))
    window = batch[:, -8:]  # at most max_len items reach the encoder
    assert inputs.shape == targets.shape == trained.shape == (64, 8)
    assert trained.any(1).all()  # at least one masked position per row
    assert not (trained & (window == 0)).any()  # padding is never masked
    assert torch.equal(inputs[trained], torch.full((int(trained.sum()),), MASK))
    assert torch.equal(inputs[~trained], window[~trained])
    assert torch.equal(targets[trained], window[trained])
    assert (targets[~trained] == 0).all()
    rate = trained[32:].float().mean().item()  # full rows: about mask_prob of their items
    assert 0.4 < rate < 0.6


def test_cloze_inputs_repeat_with_the_generator_seed() -> None:
    encoder = _encoder()
    batch = torch.randint(1, N_ITEMS + 1, (16, 9))
    first = encoder.training_inputs(batch, torch.Generator().manual_seed(3))
    second = encoder.training_inputs(batch, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_last_item_samples_mask_only_the_last_item() -> None:
    encoder = _encoder(last_item_prob=1.0)
    batch = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    inputs, targets, trained = encoder.training_inputs(batch, torch.Generator().manual_seed(0))
    assert torch.equal(inputs, torch.tensor([[0, 0, 5, 6, MASK], [1, 2, 3, 4, MASK]]))
    assert torch.equal(targets, torch.tensor([[0, 0, 0, 0, 7], [0, 0, 0, 0, 5]]))
    assert torch.equal(trained, targets != 0)


def test_a_row_with_nothing_masked_trains_its_last_item() -> None:
    encoder = _encoder(mask_prob=1e-9, last_item_prob=0.0)  # the draw masks (almost surely) nothing
    batch = torch.tensor([[0, 3, 4], [5, 6, 7]])
    _, targets, _ = encoder.training_inputs(batch, torch.Generator().manual_seed(0))
    assert torch.equal(targets, torch.tensor([[0, 0, 4], [0, 0, 7]]))


@pytest.mark.parametrize("changes", [{"mask_prob": 0.0}, {"mask_prob": 1.5}, {"last_item_prob": -0.1},
                                     {"max_len": 1}])
def test_bad_options_are_refused(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        BERT4RecConfig(n_items=N_ITEMS, **changes)  # type: ignore[arg-type]
