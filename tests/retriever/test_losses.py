import math

import pytest
import torch
import torch.nn.functional as F

from common.errors import RetrieverError
from retriever.losses import LossContext, bce, compute_loss, full_softmax, infonce, item_log_prob, sampled_softmax

N_ITEMS, D, TAU = 12, 8, 0.1


def _ctx(**kwargs: object) -> LossContext:
    return LossContext(temperature=TAU, project=lambda x: F.normalize(x, dim=-1), **kwargs)  # type: ignore[arg-type]


def _batch(targets: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    hidden = F.normalize(torch.randn(len(targets), D), dim=-1)
    items = torch.randn(N_ITEMS + 1, D)
    return hidden, torch.tensor(targets), items


def test_infonce_equals_full_cross_entropy_when_the_batch_holds_every_item() -> None:
    # Every item is some position's target, so the in-batch candidates are the whole catalogue.
    hidden, targets, items = _batch([*range(1, N_ITEMS + 1), 3, 7, 3])
    assert torch.allclose(infonce(hidden, targets, items, _ctx()), full_softmax(hidden, targets, items, _ctx()))


def test_full_softmax_matches_hand_written_cross_entropy() -> None:
    hidden, targets, items = _batch([2, 5, 9])
    logits = hidden @ F.normalize(items[1:], dim=-1).T / TAU
    expected = -torch.log_softmax(logits, dim=1)[torch.arange(3), targets - 1].mean()
    assert torch.allclose(full_softmax(hidden, targets, items, _ctx()), expected)


def test_infonce_counts_a_duplicate_target_once_and_never_as_its_own_negative() -> None:
    hidden, targets, items = _batch([4, 4, 6])
    unit = F.normalize(items, dim=-1)
    candidates = torch.tensor([4, 6])
    logits = hidden @ unit[candidates].T / TAU
    expected = F.cross_entropy(logits, torch.tensor([0, 0, 1]))
    assert torch.allclose(infonce(hidden, targets, items, _ctx()), expected)


def test_logq_subtracts_log_of_the_in_batch_inclusion_probability() -> None:
    hidden, targets, items = _batch([1, 2, 2])
    log_prob = torch.log(torch.tensor([0.0, 0.5, 0.25, *[0.25 / 10] * 10]))
    got = infonce(hidden, targets, items, _ctx(item_log_prob=log_prob), logq=True)
    unit = F.normalize(items, dim=-1)
    inclusion = torch.tensor([1 - (1 - 0.5) ** 3, 1 - (1 - 0.25) ** 3])
    logits = hidden @ unit[[1, 2]].T / TAU - inclusion.log()
    assert torch.allclose(got, F.cross_entropy(logits, torch.tensor([0, 1, 1])), atol=1e-5)


def test_mixed_uniform_negatives_equal_to_the_positive_are_masked() -> None:
    hidden, targets, items = _batch([1, 2])
    loss = infonce(hidden, targets, items, _ctx(generator=torch.Generator().manual_seed(0)), n_uniform=50)
    negatives = torch.randint(1, N_ITEMS + 1, (50,), generator=torch.Generator().manual_seed(0))
    assert (negatives == 1).any()
    assert (negatives == 2).any()
    unit = F.normalize(items, dim=-1)
    in_batch = hidden @ unit[[1, 2]].T / TAU
    extra = (hidden @ unit[negatives].T / TAU).masked_fill(negatives[None, :] == targets[:, None], -torch.inf)
    expected = F.cross_entropy(torch.cat([in_batch, extra], dim=1), torch.tensor([0, 1]))
    assert torch.allclose(loss, expected)


def test_sampled_softmax_matches_hand_written_version() -> None:
    hidden, targets, items = _batch([3, 5])
    loss = sampled_softmax(hidden, targets, items, _ctx(generator=torch.Generator().manual_seed(1)), n_negatives=20)
    negatives = torch.randint(1, N_ITEMS + 1, (20,), generator=torch.Generator().manual_seed(1))
    unit = F.normalize(items, dim=-1)
    positive = (hidden * unit[targets]).sum(-1, keepdim=True)
    negative = (hidden @ unit[negatives].T).masked_fill(negatives[None, :] == targets[:, None], -torch.inf)
    expected = F.cross_entropy(torch.cat([positive, negative], 1) / TAU, torch.zeros(2, dtype=torch.long))
    assert torch.allclose(loss, expected)


def test_sampled_softmax_with_no_usable_negative_is_zero() -> None:
    # One item besides padding: every negative equals the positive and is masked out.
    hidden = F.normalize(torch.randn(2, D), dim=-1)
    items = torch.randn(2, D)
    loss = sampled_softmax(hidden, torch.tensor([1, 1]), items, _ctx(), n_negatives=5)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)


def test_bce_negative_is_never_the_positive() -> None:
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(1, N_ITEMS + 1, (5000,))
    from retriever.losses import _uniform_per_row

    negatives = _uniform_per_row(targets, N_ITEMS, gen)
    assert not torch.any(negatives == targets)
    assert int(negatives.min()) == 1
    assert int(negatives.max()) == N_ITEMS
    hidden, t, items = _batch([3, 4])
    assert torch.isfinite(bce(hidden, t, items, _ctx(generator=gen)))


def test_bce_over_a_one_item_catalogue_is_a_retriever_error() -> None:
    # it was torch's "random_ expects 'from' to be less than 'to'": there is no item to draw but the positive
    hidden, targets, items = _batch([1, 1])
    with pytest.raises(RetrieverError) as err:
        bce(hidden, targets, items[:2], _ctx(generator=torch.Generator().manual_seed(0)))
    assert str(err.value) == ("loss bce draws each position's negative from the items other than its target: it needs "
                              "a catalogue of at least 2 items, this one has 1")
    two = bce(hidden, torch.tensor([1, 2]), items[:3], _ctx(generator=torch.Generator().manual_seed(0)))
    assert torch.isfinite(two)


def test_item_log_prob_is_a_smoothed_distribution() -> None:
    log_prob = item_log_prob(torch.tensor([1, 1, 2]), 3)
    assert math.isclose(float(log_prob[1:].exp().sum()), 1.0, rel_tol=1e-6)
    assert float(log_prob[1]) > float(log_prob[2]) > float(log_prob[3])


def test_unknown_loss_name() -> None:
    hidden, targets, items = _batch([1])
    with pytest.raises(ValueError, match="unknown loss"):
        compute_loss("nope", hidden, targets, items, _ctx())  # type: ignore[arg-type]
