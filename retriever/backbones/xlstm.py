"""xLSTM with mLSTM blocks (Beck et al. 2024; the xLSTM study), plain PyTorch.

The mLSTM cell keeps, per head, a matrix memory and a normaliser:

    C_t = f_t C_{t-1} + i_t v_t k_t^T        n_t = f_t n_{t-1} + i_t k_t
    h_t = o_t * (C_t q_t) / max(|n_t^T q_t|, 1)

with an exponential input gate i_t = exp(i~_t), a sigmoid forget gate (log f_t =
logsigmoid(f~_t), the paper's choice for mLSTM) or an exponential one (log f_t = f~_t), and
a sigmoid output gate. exp() overflows, so every form carries a stabiliser m_t (a running
max of log weights) and stores C_t e^{-m_t}, n_t e^{-m_t}; the "1" floor becomes e^{-m_t}.
h_t does not depend on which m_t a form picks, so the forms below are interchangeable:

- ``recurrent``: one step at a time, m_t = max(log f_t + m_{t-1}, i~_t) (the paper's form);
- ``chunkwise`` (default): parallel inside chunks of ``chunk_size`` steps (a (L, L)
  decay-weighted q k^T matrix), the recurrent state handed from chunk to chunk. A history
  no longer than ``chunk_size`` is one chunk, i.e. the fully parallel form; longer ones are
  cut into chunks automatically, so memory grows as T * chunk_size, not T^2.

Left padding: a padding step has forget gate 1 (log f = 0) and input gate 0 (i~ = -inf),
so it leaves (C, n, m) exactly as they were, and the first real item starts from the
same zero state whatever the padding. The residual stream is zeroed at padding positions
after every block, so the causal convolution sees zeros there, as at a sequence start.

Block (the paper's mLSTM block, pre-norm residual): x + down(mLSTM(...) * SiLU(z)), where
RMSNorm(x) is up-projected by ``proj_factor`` into a cell branch and a gate branch z; the
cell branch goes through a causal depthwise convolution and SiLU to give q and k (v is
taken before the convolution), the input and forget gates are per head from (q, k, v), the
cell output is normalised per head and gets a learnable skip from the convolution. q, k, v
are full linear maps here, where the paper uses block-diagonal ones (fewer parameters,
same function class at these widths). sLSTM blocks are not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import RMSNorm, init_weights


@dataclass(frozen=True)
class XLSTMConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.1
    emb_dropout: float = 0.1
    proj_factor: float = 2.0
    conv_kernel: int = 4
    forget_gate: Literal["sigmoid", "exp"] = "sigmoid"
    form: Literal["chunkwise", "recurrent"] = "chunkwise"
    chunk_size: int = 64


def mlstm_recurrent(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, log_i: Tensor) -> Tensor:
    """Step-by-step mLSTM: q, k, v (B, H, T, dh), log gates (B, H, T) -> normalised memory read (B, H, T, dh)."""
    B, H, T, dh = q.shape
    memory = q.new_zeros(B, H, dh, dh)  # C e^{-m}, stored as (key dim, value dim)
    normaliser = q.new_zeros(B, H, dh)  # n e^{-m}
    m = q.new_zeros(B, H)
    reads = []
    for t in range(T):
        m_next = torch.maximum(log_f[..., t] + m, log_i[..., t])
        forget = torch.exp(log_f[..., t] + m - m_next)  # (B, H)
        write = torch.exp(log_i[..., t] - m_next)  # (B, H); exactly 0 on padding steps
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]  # each (B, H, dh)
        memory = forget[..., None, None] * memory + write[..., None, None] * k_t[..., :, None] * v_t[..., None, :]
        normaliser = forget[..., None] * normaliser + write[..., None] * k_t
        m = m_next
        numerator = (q_t.unsqueeze(-2) @ memory).squeeze(-2)  # (B, H, dh)
        denominator = torch.maximum((normaliser * q_t).sum(-1).abs(), torch.exp(-m))  # (B, H)
        reads.append(numerator / denominator[..., None])
    return torch.stack(reads, dim=2)


def mlstm_chunkwise(q: Tensor, k: Tensor, v: Tensor, log_f: Tensor, log_i: Tensor, chunk_size: int) -> Tensor:
    """Chunkwise-parallel mLSTM, same signature and result as ``mlstm_recurrent``."""
    B, H, T, dh = q.shape
    memory = q.new_zeros(B, H, dh, dh)
    normaliser = q.new_zeros(B, H, dh)
    m = q.new_zeros(B, H)
    reads = []
    for start in range(0, T, chunk_size):
        part = slice(start, start + chunk_size)
        qc, kc, vc, gate_i = q[:, :, part], k[:, :, part], v[:, :, part], log_i[:, :, part]
        L = qc.shape[2]
        decay = log_f[:, :, part].cumsum(-1)  # (B, H, L): sum of log f from the chunk start to t, inclusive
        # log weight of step s's write in the memory at step t (s <= t in the chunk), and of the carried state
        within = decay[..., :, None] - decay[..., None, :] + gate_i[..., None, :]  # (B, H, L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        within = within.masked_fill(~causal, -torch.inf)
        carried = decay + m[..., None]  # (B, H, L)
        m_t = torch.maximum(carried, within.amax(-1))  # (B, H, L); the recurrent form's m_t
        scores = (qc @ kc.transpose(-1, -2)) * torch.exp(within - m_t[..., None])  # (B, H, L, L)
        carry = torch.exp(carried - m_t)  # (B, H, L)
        numerator = scores @ vc + carry[..., None] * (qc @ memory)  # (B, H, L, dh)
        denominator = scores.sum(-1) + carry * (qc @ normaliser[..., None]).squeeze(-1)  # (B, H, L)
        reads.append(numerator / torch.maximum(denominator.abs(), torch.exp(-m_t))[..., None])
        # hand the state at the chunk's last step to the next chunk
        to_end = decay[..., -1:] - decay + gate_i  # (B, H, L): log weight of each write at the chunk end
        m_end = torch.maximum(decay[..., -1] + m, to_end.amax(-1))  # (B, H)
        keep = torch.exp(decay[..., -1] + m - m_end)  # (B, H)
        weighted_k = kc * torch.exp(to_end - m_end[..., None])[..., None]  # (B, H, L, dh)
        memory = keep[..., None, None] * memory + weighted_k.transpose(-1, -2) @ vc
        normaliser = keep[..., None] * normaliser + weighted_k.sum(2)
        m = m_end
    return torch.cat(reads, dim=2)


class MLSTMLayer(nn.Module):
    """The mLSTM block's body: up-projection, causal conv, multi-head mLSTM cell, gate, down-projection."""

    def __init__(self, config: XLSTMConfig) -> None:
        super().__init__()
        inner = int(config.d_model * config.proj_factor)
        if inner % config.n_heads:
            raise ValueError(f"d_model * proj_factor = {inner} is not divisible by n_heads {config.n_heads}")
        self.config = config
        self.n_heads = config.n_heads
        self.up = nn.Linear(config.d_model, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, config.conv_kernel, groups=inner)  # depthwise; left-padded in forward
        self.q = nn.Linear(inner, inner, bias=False)
        self.k = nn.Linear(inner, inner, bias=False)
        self.v = nn.Linear(inner, inner, bias=False)
        self.gates = nn.Linear(3 * inner, 2 * config.n_heads)  # input and forget pre-activations per head
        self.out_gate = nn.Linear(inner, inner)
        self.head_norm = nn.Parameter(torch.ones(inner))
        self.skip = nn.Parameter(torch.ones(inner))
        self.down = nn.Linear(inner, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def reset_gates(self) -> None:
        # As the paper's code: gates start input-independent, forget biases spread over (3, 6) so heads
        # begin with long and very long memories (f = 0.95 ... 0.998), input biases near 0.
        H = self.n_heads
        with torch.no_grad():
            self.gates.weight.zero_()
            self.gates.bias[:H].normal_(0.0, 0.1)
            self.gates.bias[H:].copy_(torch.linspace(3.0, 6.0, H))

    def forward(self, x: Tensor, real: Tensor) -> Tensor:
        """x (B, T, D) normed input, real (B, T) bool -> (B, T, D) block output."""
        B, T, _ = x.shape
        H = self.n_heads
        cell_in, z = self.up(x).chunk(2, dim=-1)  # each (B, T, inner)
        inner = cell_in.shape[-1]
        dh = inner // H
        conv = self.conv(F.pad(cell_in.transpose(1, 2), (self.config.conv_kernel - 1, 0)))  # (B, inner, T)
        conv = F.silu(conv.transpose(1, 2))  # (B, T, inner)
        q, k, v = self.q(conv), self.k(conv) / math.sqrt(dh), self.v(cell_in)  # each (B, T, inner)
        pre_i, pre_f = self.gates(torch.cat([q, k, v], dim=-1)).view(B, T, 2, H).unbind(2)  # each (B, T, H)
        log_f = F.logsigmoid(pre_f) if self.config.forget_gate == "sigmoid" else pre_f
        padding = ~real[..., None]  # (B, T, 1)
        log_f = log_f.masked_fill(padding, 0.0).transpose(1, 2)  # (B, H, T); forget gate 1 on padding
        log_i = pre_i.masked_fill(padding, -torch.inf).transpose(1, 2)  # (B, H, T); input gate 0 on padding
        q, k, v = (t.view(B, T, H, dh).transpose(1, 2) for t in (q, k, v))  # each (B, H, T, dh)
        if self.config.form == "recurrent":
            read = mlstm_recurrent(q, k, v, log_f, log_i)
        else:
            read = mlstm_chunkwise(q, k, v, log_f, log_i, self.config.chunk_size)
        read = read.transpose(1, 2).reshape(B, T, inner)  # (B, T, inner)
        h = torch.sigmoid(self.out_gate(cell_in)) * read  # the cell's output gate o_t
        h = F.layer_norm(h.view(B, T, H, dh), (dh,)).view(B, T, inner) * self.head_norm  # per-head norm
        h = (h + self.skip * conv) * F.silu(z)
        return self.dropout(self.down(h))


class MLSTMBlock(nn.Module):
    def __init__(self, config: XLSTMConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.d_model)
        self.mlstm = MLSTMLayer(config)

    def forward(self, x: Tensor, real: Tensor) -> Tensor:
        return (x + self.mlstm(self.norm(x), real)) * real[..., None]


class XLSTM(SequenceEncoder):
    def __init__(self, config: XLSTMConfig) -> None:
        super().__init__()
        if config.chunk_size < 1 or config.conv_kernel < 1:
            raise ValueError(f"chunk_size and conv_kernel must be >= 1, got {config.chunk_size} and "
                             f"{config.conv_kernel}")
        if config.forget_gate not in ("sigmoid", "exp") or config.form not in ("chunkwise", "recurrent"):
            raise ValueError(f"forget_gate must be sigmoid or exp and form chunkwise or recurrent, got "
                             f"{config.forget_gate!r} and {config.form!r}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(MLSTMBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.apply(init_weights)
        for module in self.modules():
            if isinstance(module, MLSTMLayer):
                module.reset_gates()

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states."""
        real = item_ids != 0
        x = self.emb_dropout(self.item_emb(item_ids)) * real[..., None]  # (B, T, D)
        for block in self.blocks:
            x = block(x, real)
        return self.norm(x)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight
