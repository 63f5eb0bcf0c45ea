"""Recurrent encoders: GRU4Rec (Hidasi et al. 2016, in its RecBole form) and the standard LSTM
baseline of the xLSTM study. One model with two cells: item embeddings -> stacked GRU or LSTM ->
projection.

The output table is the input embedding table (as every backbone here), so the hidden size may
differ from d_model: a linear layer maps it back when it does. The xLSTM study's LSTM scores
with its own output layer over all items; here the table is shared so it scores through the
common retriever. Causal by construction.

Left padding: a recurrent cell fed leading padding does not stay at its zero initial state (its
biases move it), so the user vector would depend on how much padding a batch carries. Each row
is rolled so that its first item sits at t = 0, the cell runs over the aligned rows, and the
outputs are rolled back; real positions then see exactly their own history, and the positions
that were padding (now computed from the trailing garbage) are zeroed. This keeps the cuDNN
kernel of ``nn.GRU``/``nn.LSTM`` without packing (no lengths copied to the host).

The two registry names keep their own config classes and defaults (one GRU layer, two LSTM
layers) and their own state_dict keys (``gru.*``, ``lstm.*``), so configs and artifacts
written before the two shared this file still load.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder


@dataclass(frozen=True)
class RecurrentConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    hidden_size: int | None = None  # None = d_model
    n_layers: int = 1
    dropout: float = 0.2
    emb_dropout: float = 0.2


@dataclass(frozen=True)
class GRU4RecConfig(RecurrentConfig):
    pass


@dataclass(frozen=True)
class LSTMConfig(RecurrentConfig):
    n_layers: int = 2


class RecurrentEncoder(SequenceEncoder):
    """The shared model; ``cell`` is nn.GRU or nn.LSTM, registered under ``cell_name``."""

    def __init__(self, config: RecurrentConfig, cell: type[nn.GRU | nn.LSTM], cell_name: str) -> None:
        super().__init__()
        hidden = config.hidden_size or config.d_model
        if config.n_layers < 1 or hidden < 1:
            raise ValueError(f"n_layers and hidden_size must be >= 1, got {config.n_layers} and {hidden}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        # The cell's dropout acts between layers only (and warns when there is a single layer).
        # Modules are created in this order so that a seed draws the same initial weights as
        # when each model had its own file.
        self.cell_name = cell_name
        self.add_module(cell_name, cell(config.d_model, hidden, config.n_layers, batch_first=True,
                                        dropout=config.dropout if config.n_layers > 1 else 0.0))
        self.dropout = nn.Dropout(config.dropout)
        self.proj = nn.Linear(hidden, config.d_model) if hidden != config.d_model else nn.Identity()
        nn.init.normal_(self.item_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    @property
    def rnn(self) -> nn.RNNBase:
        rnn = self.get_submodule(self.cell_name)
        assert isinstance(rnn, nn.RNNBase)
        return rnn

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states (zero at padding)."""
        aligned, shift = left_align(item_ids)
        x = self.emb_dropout(self.item_emb(aligned))  # (B, T, D)
        out, _ = self.rnn(x)  # (B, T, hidden)
        out = self.proj(self.dropout(restore_alignment(out, shift)))
        return out * (item_ids != 0).unsqueeze(-1)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight


class GRU4Rec(RecurrentEncoder):
    def __init__(self, config: GRU4RecConfig) -> None:
        super().__init__(config, nn.GRU, "gru")


class LSTM(RecurrentEncoder):
    def __init__(self, config: LSTMConfig) -> None:
        super().__init__(config, nn.LSTM, "lstm")
        hidden = self.rnn.hidden_size
        with torch.no_grad():
            for name, param in self.rnn.named_parameters():
                if name.startswith("bias_ih"):
                    # Forget-gate bias 1 (Jozefowicz et al. 2015): the cell remembers by default
                    # early in training. PyTorch orders the gates input, forget, cell, output.
                    param[hidden : 2 * hidden].fill_(1.0)


def left_align(item_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Roll each left-padded row so its first item is at t = 0: (aligned (B, T) ids, (B,) shifts).

    Only leading zeros move to the end; a 0 inside a history stays where it is (an input of
    zeros, as a padding embedding is). An all-padding row is left as it is.
    """
    T = item_ids.shape[1]
    shift = (item_ids != 0).int().argmax(1)  # (B,) index of the first item (argmax returns the first maximum)
    cols = torch.arange(T, device=item_ids.device)
    return item_ids.gather(1, (cols + shift[:, None]) % T), shift


def restore_alignment(x: Tensor, shift: Tensor) -> Tensor:
    """Undo ``left_align`` on (B, T, H) per-position outputs."""
    B, T, H = x.shape
    cols = torch.arange(T, device=x.device)
    index = ((cols - shift[:, None]) % T).unsqueeze(-1).expand(B, T, H)  # (B, T, H)
    return x.gather(1, index)
