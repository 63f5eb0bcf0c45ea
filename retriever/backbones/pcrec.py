"""PCRec (Xie et al., KDD 2025).

**Base** (4.2.1), a compact HSTU layer of our own: item embedding times sqrt(D)
plus a learned position (counted from the right, as in ``sasrec``, so extra left padding
changes nothing), then per layer

    U, V, Q, K = split(SiLU(W RMSNorm(x) + b))
    A = SiLU(Q K^T + rab) / max_len          pointwise, no softmax; causal, padded keys 0
    x = x + dropout(W_o (LayerNorm(A V) * U))

with a learned relative position bias per head and distance i - j; the temporal part of
the paper's rab is left out, as the encoder sees item ids only. Dividing by the fixed
``max_len`` (HSTU's n) instead of the batch width keeps outputs independent of padding.

**Predictive coding in the forward pass** (4.2.4). The L + 1 states s_0 (embeddings) ...
s_L (last layer) of the feed-forward pass are the initial activities of a hierarchy in
which each state is predicted from the one before it by mixing over the sequence (the
paper's Figure 4; it numbers layers from the output, so its s_0 is our s_L):

    mu_j = theta_j f(s_{j-1})      theta_j: (T, T), row i mixes positions k <= i
    eps_j = s_j - mu_j             E = 1/2 sum_j ||eps_j||^2

and ``pc_steps`` relaxation steps follow, each a gradient step on E:

    activities  s_j += gamma_j * (-eps_j + f'(s_j) * theta_{j+1}^T eps_{j+1})   (no eps_0, no eps_{L+1})
                gamma_j = sigmoid(W_j s_j + b_j), learned, one rate per layer and position
    weights     theta_j += alpha * eps_j f(s_{j-1})^T                          per sequence

f is softplus by default (the paper's best with sigmoid). The output is the relaxed s_L,
RMS-normalised. The weight update is a per-user fast weight: after it, the prediction at
position i gains alpha * sum_k (eps_i . f_k) f_k, a linear attention over the user's own
states; it is trained end to end through these updates, gamma and the base theta with it.
Choices the paper leaves open, and our reasons:

- Causality. theta^T eps would carry the errors of later positions back to earlier ones,
  which leaks the future when every position is trained at once; the activity update keeps
  each position's own term (the diagonal of theta). For the last position of a prefix
  (whose state is the user vector) that is the exact gradient of the prefix's E.
- The base theta_j is a learned weight per distance i - j (so left padding leaves it
  unchanged and one table serves any length), zero on padded rows and columns.
- alpha is given per dimension and position: the update applied is
  alpha / (d_model * max_len) * eps f^T, so one alpha suits every size (the raw sum grows
  with both; the paper's alpha is this one rescaled by a constant).
- Order within a step follows the paper, activities first and weights second (with errors
  recomputed from the updated activities); a weight update is read only by the next step,
  so the last step's is skipped: ``pc_steps=1`` updates activities only. A change to a
  state reaches the output after as many steps as that state is layers below it.

**PCRec-simple** (4.2.3) works with any causal backbone, so it is not here but in
``Retriever.personalize`` (retriever/model.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import RMSNorm, init_weights_padding_idx

Activation = Literal["softplus", "sigmoid", "tanh", "relu", "identity"]
Fn = Callable[[Tensor], Tensor]
ACTIVATIONS: dict[str, tuple[Fn, Fn]] = {  # f and its derivative f'
    "softplus": (F.softplus, torch.sigmoid),
    "sigmoid": (torch.sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
    "tanh": (torch.tanh, lambda x: 1 - torch.tanh(x) ** 2),
    "relu": (F.relu, lambda x: (x > 0).to(x.dtype)),
    "identity": (lambda x: x, torch.ones_like),
}
RATE_BIAS = -2.0  # gamma starts near sigmoid(-2) = 0.12: the feed-forward states dominate early training


@dataclass(frozen=True)
class PCRecConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.2
    emb_dropout: float = 0.2
    pc_steps: int = 2
    alpha: float = 0.1
    activation: Activation = "softplus"


class HSTULayer(nn.Module):
    def __init__(self, dim: int, n_heads: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.max_len = max_len
        self.norm_shape = (dim,)  # a constant rather than x.shape[-1:]: the ONNX trace then needs no shape arithmetic
        self.norm = RMSNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.rab = nn.Parameter(torch.zeros(n_heads, max_len))  # bias per head and distance i - j
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, allowed: Tensor, distance: Tensor) -> Tensor:
        """x (B, T, D); allowed (B, T, T) bool, real query and key, key not in the future; distance (T, T)."""
        B, T, D = x.shape
        H, hd = self.n_heads, D // self.n_heads
        u, v, q, k = F.silu(self.uvqk(self.norm(x))).chunk(4, dim=-1)  # each (B, T, D)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))  # each (B, H, T, hd)
        weights = F.silu(q @ k.transpose(-1, -2) + self.rab[:, distance]) * allowed[:, None] / self.max_len
        y = (weights @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return x + self.dropout(self.out(F.layer_norm(y, self.norm_shape) * u))


class PredictiveCoding(nn.Module):
    """Top-down predictions between consecutive states, their errors, and the two updates."""

    def __init__(self, config: PCRecConfig) -> None:
        super().__init__()
        self.steps = config.pc_steps
        self.alpha = config.alpha / (config.d_model * config.max_len)
        self.f, self.f_prime = ACTIVATIONS[config.activation]
        self.theta = nn.Parameter(torch.zeros(config.n_layers, config.max_len))  # base theta_j per distance
        self.rates = nn.ModuleList(nn.Linear(config.d_model, 1) for _ in range(config.n_layers + 1))

    def base_thetas(self, allowed: Tensor, distance: Tensor) -> list[Tensor]:
        """One (B, T, T) theta_j per layer, zero where a query may not see a key."""
        return [w[distance] * allowed for w in self.theta.unbind(0)]

    def errors(self, states: list[Tensor], thetas: list[Tensor], keep: Tensor) -> list[Tensor]:
        """eps_j = s_j - theta_j f(s_{j-1}) for j = 1..L, each (B, T, D), zero at padding."""
        return [(s - theta @ (self.f(prev) * keep)) * keep for prev, s, theta in
                zip(states[:-1], states[1:], thetas, strict=True)]

    def update_states(self, states: list[Tensor], thetas: list[Tensor], errors: list[Tensor]) -> list[Tensor]:
        """s_j += gamma_j * (-dE/ds_j), the backward term restricted to each position's own error."""
        updated = []
        for j, s in enumerate(states):
            descent = -errors[j - 1] if j > 0 else torch.zeros_like(s)
            if j < len(errors):
                own = torch.diagonal(thetas[j], dim1=-2, dim2=-1).unsqueeze(-1)  # (B, T, 1): theta_{j+1}[i, i]
                descent = descent + self.f_prime(s) * own * errors[j]
            updated.append(s + torch.sigmoid(self.rates[j](s)) * descent)
        return updated

    def update_weights(self, states: list[Tensor], thetas: list[Tensor], errors: list[Tensor], keep: Tensor,
                       allowed: Tensor) -> list[Tensor]:
        """theta_j += alpha eps_j f(s_{j-1})^T on the allowed (causal, real) entries: -alpha dE/dtheta_j."""
        return [theta + self.alpha * allowed * (eps @ (self.f(prev) * keep).transpose(1, 2))  # (B, T, T)
                for theta, eps, prev in zip(thetas, errors, states[:-1], strict=True)]

    def forward(self, states: list[Tensor], allowed: Tensor, distance: Tensor, keep: Tensor) -> list[Tensor]:
        """Relax the feed-forward states (L + 1 of (B, T, D)) for ``pc_steps`` steps."""
        thetas = self.base_thetas(allowed, distance)
        for step in range(self.steps):
            states = self.update_states(states, thetas, self.errors(states, thetas, keep))
            if step + 1 < self.steps:
                thetas = self.update_weights(states, thetas, self.errors(states, thetas, keep), keep, allowed)
        return states


def energy(errors: list[Tensor]) -> Tensor:
    """(B,) E = 1/2 sum of squared prediction errors over layers, positions and dimensions."""
    return 0.5 * torch.stack([e.pow(2).sum((1, 2)) for e in errors]).sum(0)


class PCRec(SequenceEncoder):
    def __init__(self, config: PCRecConfig) -> None:
        super().__init__()
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}")
        if config.pc_steps < 0:
            raise ValueError(f"pc_steps must be >= 0, got {config.pc_steps}")
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {config.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.layers = nn.ModuleList(HSTULayer(config.d_model, config.n_heads, config.max_len, config.dropout)
                                    for _ in range(config.n_layers))
        self.pc = PredictiveCoding(config)
        self.norm = RMSNorm(config.d_model)
        self.apply(init_weights_padding_idx)
        for module in self.pc.rates.modules():
            if isinstance(module, nn.Linear):
                nn.init.constant_(module.bias, RATE_BIAS)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T', D) hidden states, T' = min(T, max_len)."""
        return self.norm(self.states(item_ids)[-1])

    def states(self, item_ids: Tensor, *, relax: bool = True) -> list[Tensor]:
        """The L + 1 states (B, T', D): embeddings then each layer's output, relaxed unless told not to."""
        max_len = self.config.max_len
        item_ids = item_ids[:, -max_len:]
        T = item_ids.shape[1]
        real = item_ids != 0
        keep = real.unsqueeze(-1).to(self.item_emb.weight.dtype)  # (B, T, 1)
        index = torch.arange(T, device=item_ids.device)
        distance = (index[:, None] - index[None, :]).clamp(min=0)  # (T, T); the future is masked anyway
        allowed = (index[:, None] >= index[None, :]) & real[:, :, None] & real[:, None, :]  # (B, T, T)
        positions = torch.arange(max_len - T, max_len, device=item_ids.device)
        x = self.item_emb(item_ids) * math.sqrt(self.config.d_model) + self.pos_emb(positions)  # (B, T, D)
        states = [self.emb_dropout(x) * keep]
        for layer in self.layers:
            states.append(layer(states[-1], allowed, distance) * keep)
        return self.pc(states, allowed, distance, keep) if relax else states

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight
