"""Large catalogues: a training step's tensors are bounded by the batch, not by batch x catalogue.

Every tensor that one step creates (forward, backward, optimiser) is recorded through a
TorchDispatchMode. In-batch InfoNCE (with logQ and uniform negatives) and the sampled softmax
must never create anything as large as (positions x n_items); the only catalogue-sized tensors
are the item table's own shape (its gradient and the optimiser's moments). The full softmax is
the contrast: it does build the (positions x n_items) logits, which is why it is not the loss
for such catalogues.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from retriever.config import config_from_dict
from retriever.losses import LossContext, item_log_prob
from retriever.train import make_optimizer, train_step

N_ITEMS = 200_000  # big enough that positions x catalogue (32M) dwarfs everything else; the rule is size-free
D = 8
B, T = 16, 10


class LargestTensor(TorchDispatchMode):
    """Remembers the largest tensor (in elements) any op returned."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.op = ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor) and value.numel() > self.largest:
                self.largest, self.op = value.numel(), str(func)
        return out


def _largest_in_one_step(loss: dict[str, Any]) -> tuple[int, str]:
    config = config_from_dict({
        "model": {"backbone": "transformer", "max_len": T, "d_model": D, "n_layers": 1, "n_heads": 1},
        "loss": loss, "train": {"batch_size": B, "threads": 1},
    }, source="test")
    torch.manual_seed(0)
    model = config.build(N_ITEMS)
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(1, N_ITEMS + 1, (B, T + 1), generator=generator)
    ctx = LossContext(temperature=model.temperature, project=model._project, generator=generator,
                      item_log_prob=item_log_prob(batch.flatten(), N_ITEMS))
    train_step(model, batch, optimizer, config, ctx)  # the optimiser's moments exist from here on
    with LargestTensor() as seen:
        train_step(model, batch, optimizer, config, ctx)
    return seen.largest, seen.op


@pytest.mark.parametrize("loss", [
    {"name": "infonce"},
    {"name": "infonce", "logq": True, "n_uniform": 512},
    {"name": "sampled", "n_negatives": 512},
])
def test_batch_bounded_losses_never_build_positions_by_catalogue(loss: dict[str, Any]) -> None:
    largest, op = _largest_in_one_step(loss)
    table = (N_ITEMS + 1) * D
    assert largest <= table, f"{op} made {largest:,} elements, more than the item table's {table:,}"
    assert largest < B * T * N_ITEMS // 10


def test_full_softmax_does_build_positions_by_catalogue() -> None:
    largest, _ = _largest_in_one_step({"name": "full"})
    assert largest >= B * T * N_ITEMS // 2  # every trained position scored against every item
