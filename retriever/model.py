"""A sequence encoder turned into a retriever: user vectors, item vectors, scores.

Scores are cosine similarities divided by a temperature (seed 002: tau = 0.05 matters
with cosine), or raw dot products for models trained that way (the original SASRec).
Training, export, evaluation and the service all go through these three methods.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones import SequenceEncoder

Similarity = Literal["cosine", "dot"]


class Retriever(nn.Module):
    encoder: SequenceEncoder

    def __init__(
        self, encoder: SequenceEncoder, *, temperature: float = 0.05, similarity: Similarity = "cosine"
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.encoder = encoder
        self.temperature = temperature
        self.similarity = similarity

    def hidden(self, item_ids: Tensor) -> Tensor:
        """(B, T) -> (B, T, D) encoder states, projected for scoring (unit length for cosine)."""
        return self._project(self.encoder(item_ids))

    def item_vectors(self) -> Tensor:
        """(n_items + 1, D) scoring vectors; row 0 is padding and never a candidate."""
        return self._project(self.encoder.item_embeddings())

    def user_vectors(self, item_ids: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D): the state at the last position."""
        encode_last = getattr(self.encoder, "encode_last", None)  # an encoder's optional inference shortcut
        last = encode_last(item_ids) if encode_last is not None else self.encoder(item_ids)[:, -1]
        return self._project(last)

    def score(self, item_ids: Tensor) -> Tensor:
        """(B, T) histories -> (B, n_items + 1) scores; column 0 (padding) is -inf."""
        scores = self.user_vectors(item_ids) @ self.item_vectors().T / self.temperature
        scores[:, 0] = -torch.inf
        return scores

    def _project(self, x: Tensor) -> Tensor:
        return F.normalize(x.float(), dim=-1) if self.similarity == "cosine" else x.float()
