"""The encoder contract: what every backbone provides, and the optional hooks with their defaults.

A backbone maps (B, T) item ids (0 = padding, left-padded) to (B, T, D) hidden states and
exposes its (n_items + 1, D) output item table; ``retriever.model.Retriever`` turns that into
user vectors and scores, so losses, training, export and serving are shared. The hooks below
let a model differ where it must (BERT4Rec's cloze task, TRM4Rec's ponder cost, item side
features) without the training loop, the benches or the service asking what it is: each has
a default here that is right for a plain causal encoder, and a backbone overrides only the
ones it needs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class SequenceEncoder(nn.Module):
    config: Any  # the backbone's own frozen config dataclass

    causal: bool = True
    """Whether position t sees positions <= t only. Bidirectional encoders (BERT4Rec) set False:
    the contract's causality test and PCRec-simple personalisation do not apply to them."""

    trains_on_prefixes: bool = False
    """Whether every state depends on the whole window (BSARec's frequency filter), so training must end
    one window at each target and train its last position only (``train.windows: prefixes``); the
    config refuses other window modes for such an encoder."""

    last_average_steps: float | None = None
    """Mean recurrence steps per position of the latest forward, for encoders that halt
    adaptively (TRM4Rec); None for encoders with a fixed depth."""

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states."""
        raise NotImplementedError

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table (row 0 = padding)."""
        raise NotImplementedError

    def encode_last(self, item_ids: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D): the state at the last position.

        An encoder overrides this when it can compute the last position alone, cheaper than
        every position (the transformer's final block), or reads the user another way
        (BERT4Rec's appended mask token).
        """
        return self(item_ids)[:, -1]

    def training_inputs(self, batch: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T + 1) training windows -> (inputs (B, T'), targets (B, T'), trained (B, T') bool).

        The default is next-item prediction at every position; an encoder with another
        training task (BERT4Rec's cloze masking) replaces it and may draw from ``generator``.
        """
        inputs, targets = batch[:, :-1], batch[:, 1:]
        trained = (inputs != 0) & (targets != 0)  # the first item of a window has no history to predict it from
        return inputs, targets, trained

    def auxiliary_loss(self) -> Tensor | None:
        """A term the training loop adds to the loss after each forward (a ponder cost); None = nothing."""
        return None

    def set_item_features(self, features: Tensor) -> None:
        """Hand the encoder its (n_items + 1, F) side-feature ids (``model.item_features``).

        Only encoders whose config declares ``n_features`` take them; the config check refuses
        the option for the others before training starts, so reaching this default is a bug.
        """
        raise ValueError(f"{type(self).__name__} takes no item features")

    def add_items(self, features: Tensor, id_rows: Tensor | None = None) -> None:
        """Append (M, F) new items known by their side-feature ids alone (a catalogue change without retraining):
        each is the mean of its feature embeddings, on input and output, plus ``id_rows`` as its ID part (None:
        zero; `borrowed_id_rows` gives the trained items' rows the catalogue scales).

        Only encoders that take item features can do this; the default refuses.
        """
        raise ValueError(f"{type(self).__name__} takes no item features, so new items need retraining")

    def borrowed_id_rows(self, features: Tensor) -> Tensor:
        """(M, F) feature ids -> (M, D) ID rows borrowed from the items sharing those values; the default refuses."""
        raise ValueError(f"{type(self).__name__} takes no item features, so new items need retraining")
