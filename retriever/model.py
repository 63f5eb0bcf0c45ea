"""A sequence encoder turned into a retriever: user vectors, item vectors, scores.

Scores are cosine similarities divided by a temperature (the retriever-and-ranker reference:
tau = 0.05 matters with cosine), or raw dot products for models trained that way (the original
SASRec). Training, export, evaluation and the service all go through these methods, and reach
the encoder's optional behaviour through its declared contract (retriever/backbones/base.py).

PCRec-simple (PCRec, KDD 2025, 4.2.3) is ``Retriever.personalize``: a few plain gradient steps
of rate beta on a user's own history (cross-entropy of every next item of the history, i.e.
the paper's KL to a one-hot target) before reading out that user's vector; any causal backbone.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder

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

    @property
    def causal(self) -> bool:
        """Whether the encoder reads each position from its past only (PCRec-simple needs it)."""
        return self.encoder.causal

    def hidden(self, item_ids: Tensor) -> Tensor:
        """(B, T) -> (B, T, D) encoder states, projected for scoring (unit length for cosine)."""
        return self._project(self.encoder(item_ids))

    def item_vectors(self) -> Tensor:
        """(n_items + 1, D) scoring vectors; row 0 is padding and never a candidate."""
        return self._project(self.encoder.item_embeddings())

    def user_vectors(self, item_ids: Tensor) -> Tensor:
        """(B, T) left-padded histories -> (B, D): the state at the last position."""
        return self._project(self.encoder.encode_last(item_ids))

    def score(self, item_ids: Tensor) -> Tensor:
        """(B, T) histories -> (B, n_items + 1) scores; column 0 (padding) is -inf."""
        scores = self.user_vectors(item_ids) @ self.item_vectors().T / self.temperature
        scores[:, 0] = -torch.inf
        return scores

    def history_loss(self, item_ids: Tensor) -> Tensor | None:
        """Mean cross-entropy (over all items) of every next item within (B, T) histories; None if there is none."""
        inputs, targets = item_ids[:, :-1], item_ids[:, 1:]
        trained = (inputs != 0) & (targets != 0)
        if not trained.any():
            return None
        hidden = self.hidden(inputs)[trained]  # (P, D)
        logits = hidden @ self.item_vectors()[1:].T / self.temperature  # (P, n_items); padding is not a class
        return F.cross_entropy(logits, targets[trained] - 1)

    def personalize(self, history: Tensor, *, beta: float, steps: int = 1) -> Tensor:
        """PCRec-simple: (B, T) left-padded histories -> (B, D) user vectors, each read after ``steps``
        gradient steps of rate ``beta`` on that user's own ``history_loss`` (all parameters).

        Users are optimised one at a time, each from the served weights. The steps run on a
        private copy of the model, so this model is never written to and requests served from it
        concurrently are unaffected. Call outside ``torch.inference_mode``.
        """
        if not self.causal:
            raise ValueError("personalize needs a causal encoder: a bidirectional one sees each target in its input")
        if history.ndim != 2:
            raise ValueError(f"history must be (B, T) item ids, got shape {tuple(history.shape)}")
        if beta < 0 or steps < 0:
            raise ValueError(f"beta and steps must be >= 0, got {beta} and {steps}")
        if beta == 0 or steps == 0:
            with torch.no_grad():
                return self.user_vectors(history)
        work = copy.deepcopy(self).eval()
        served, params = list(self.parameters()), list(work.parameters())
        for p in params:
            p.requires_grad_(True)  # a served model may have switched gradients off
        vectors = []
        with torch.enable_grad():
            for row in history:
                real = row.nonzero()
                ids = row[int(real[0]) if len(real) else 0 :].unsqueeze(0)  # (1, n): leading padding dropped
                with torch.no_grad():
                    for p, original in zip(params, served, strict=True):
                        p.copy_(original)
                adapt_to_history(work, ids, beta, steps)
                with torch.no_grad():
                    vectors.append(work.user_vectors(ids))
        return torch.cat(vectors)

    def _project(self, x: Tensor) -> Tensor:
        return F.normalize(x.float(), dim=-1) if self.similarity == "cosine" else x.float()


def adapt_to_history(model: Retriever, item_ids: Tensor, beta: float, steps: int) -> None:
    """``steps`` plain gradient steps of rate ``beta`` on ``model.history_loss``, in place, every parameter."""
    params = list(model.parameters())
    for _ in range(steps):
        loss = model.history_loss(item_ids)
        if loss is None:  # a single item has no next item to learn from
            return
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for p, grad in zip(params, grads, strict=True):
                if grad is not None:
                    p.sub_(beta * grad)
