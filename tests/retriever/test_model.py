"""The retriever around an encoder: the contract's defaults, and PCRec-simple personalisation
(PCRec, KDD 2025), which leaves the served model untouched and works with every causal backbone."""

import copy
import dataclasses

import pytest
import torch

from retriever.backbones import BACKBONES, backbone_config, build_encoder
from retriever.backbones.base import SequenceEncoder
from retriever.model import Retriever, adapt_to_history

N_ITEMS = 30


class _Bag(SequenceEncoder):
    """The smallest encoder: a running mean of item embeddings; it overrides no hook."""

    def __init__(self) -> None:
        super().__init__()
        self.item_emb = torch.nn.Embedding(N_ITEMS + 1, 4, padding_idx=0)

    def forward(self, item_ids: torch.Tensor) -> torch.Tensor:
        x = self.item_emb(item_ids)  # (B, T, D)
        counts = (item_ids != 0).cumsum(1).clamp(min=1).unsqueeze(-1)
        return x.cumsum(1) / counts

    def item_embeddings(self) -> torch.Tensor:
        return self.item_emb.weight


def test_every_backbone_declares_the_contract() -> None:
    for name, (_, encoder_cls) in BACKBONES.items():
        assert issubclass(encoder_cls, SequenceEncoder), name
    assert not BACKBONES["bert4rec"][1].causal
    assert BACKBONES["trm4rec"][1].auxiliary_loss is not SequenceEncoder.auxiliary_loss


def test_hook_defaults_are_those_of_a_plain_causal_encoder() -> None:
    torch.manual_seed(0)
    encoder = _Bag()
    model = Retriever(encoder)
    assert model.causal
    assert encoder.last_average_steps is None
    assert encoder.auxiliary_loss() is None
    batch = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    inputs, targets, trained = encoder.training_inputs(batch, None)
    assert torch.equal(inputs, batch[:, :-1])
    assert torch.equal(targets, batch[:, 1:])
    assert trained.tolist() == [[False, False, True, True], [True, True, True, True]]
    ids = batch[:, 1:]
    assert torch.equal(encoder.encode_last(ids), encoder(ids)[:, -1])
    with pytest.raises(ValueError, match="takes no item features"):
        encoder.set_item_features(torch.zeros(N_ITEMS + 1, 2, dtype=torch.long))
    encoder.causal = False
    assert not model.causal

TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 12, "dropout": 0.0}
CAUSAL = sorted(name for name in BACKBONES if BACKBONES[name][1].causal)


def _retriever(name: str) -> Retriever:
    fields = {f.name for f in dataclasses.fields(BACKBONES[name][0])}
    torch.manual_seed(0)
    encoder = build_encoder(name, backbone_config(name, N_ITEMS, {k: v for k, v in TINY.items() if k in fields}))
    return Retriever(encoder).eval()


@pytest.mark.parametrize("name", CAUSAL)
def test_personalize_changes_the_vector_and_leaves_the_weights_bit_identical(name: str) -> None:
    model = _retriever(name)
    history = torch.randint(1, N_ITEMS + 1, (2, 8), generator=torch.Generator().manual_seed(3))
    history[1, :2] = 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain = model.user_vectors(history)
    personal = model.personalize(history, beta=0.5)
    assert personal.shape == plain.shape
    assert not torch.allclose(personal, plain, atol=1e-4)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.allclose(model.personalize(history, beta=0.0), plain)
    # each user is optimised alone, from the served weights
    one_by_one = torch.cat([model.personalize(history[i : i + 1], beta=0.5) for i in range(2)])
    assert torch.allclose(personal, one_by_one, atol=1e-6)


@pytest.mark.parametrize("name", CAUSAL)
def test_the_step_lowers_the_loss_on_the_users_own_history(name: str) -> None:
    model = _retriever(name)
    history = torch.randint(1, N_ITEMS + 1, (1, 8), generator=torch.Generator().manual_seed(4))
    work = copy.deepcopy(model)
    before = work.history_loss(history)
    assert before is not None
    grads = torch.autograd.grad(before, list(work.parameters()), allow_unused=True)
    squared_norm = sum(float(g.pow(2).sum()) for g in grads if g is not None)
    # A step small against the curvature: at random init, cosine scores of tiny embeddings make it steep.
    adapt_to_history(work, history, beta=0.01 / squared_norm, steps=1)  # first-order decrease: 0.01 nats
    with torch.no_grad():
        after = work.history_loss(history)
    assert after is not None
    assert float(before.detach()) - 0.02 < float(after) < float(before.detach()) - 0.002


def test_personalize_ignores_left_padding_and_short_histories() -> None:
    model = _retriever("pcrec")
    history = torch.randint(1, N_ITEMS + 1, (1, 6), generator=torch.Generator().manual_seed(5))
    padded = torch.nn.functional.pad(history, (4, 0))
    assert torch.allclose(model.personalize(padded, beta=0.5), model.personalize(history, beta=0.5), atol=1e-6)
    single = torch.tensor([[0, 0, 7]])
    with torch.no_grad():
        assert torch.allclose(model.personalize(single, beta=0.5), model.user_vectors(single), atol=1e-6)


def test_personalize_refuses_a_bidirectional_encoder() -> None:
    model = _retriever("pcrec")
    model.encoder.causal = False
    with pytest.raises(ValueError, match="causal"):
        model.personalize(torch.tensor([[1, 2, 3]]), beta=0.1)
