"""The user vector: a (B, T) left-padded history through the served encoder, then normalised.

One definition for every caller: the service (`service.system.bundle.Bundle.encode`, `service.system.recommend`),
mining, `seqrec evaluate` and the parity bench (`offline.jobs.mine`), so the vector FAISS is searched with, the
one the co-occurrence merge scores with and the one the ranker's features read are the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from retriever.model import Retriever

RawEncoder = Callable[[Tensor], Tensor]  # (B, T) left-padded internal ids -> (B, D) float32, not normalised


def raw_user_vectors(model: Retriever, compiled: RawEncoder | None, history: Tensor) -> Tensor:
    """(B, T) left-padded internal ids -> (B, D) float32 user vectors (not normalised): through ``compiled``
    (the ONNX Runtime encoder, `retriever.compiled`) when the service serves it, else the eager model."""
    if compiled is not None:
        return compiled(history)
    with torch.inference_mode():
        return model.user_vectors(history).float()


def unit_user_vectors(encode: RawEncoder, history: Tensor) -> Tensor:
    """(B, T) left-padded internal ids -> (B, D) unit user vectors, the ones FAISS is searched with."""
    return torch.nn.functional.normalize(encode(history).float(), dim=-1)
