"""The standard LSTM baseline of the xLSTM study (seeds 001, 004): item embeddings -> stacked LSTM.

Same shape as GRU4Rec (and the same left alignment, so leading padding cannot move the
state): the output table is the input embedding table, and a linear layer maps the hidden
size back to d_model when they differ. The study's LSTM scores with its own output layer
over all items; here the table is shared so it scores through the common retriever.
Causal by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from retriever.backbones.gru4rec import left_align, restore_alignment


@dataclass(frozen=True)
class LSTMConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    hidden_size: int | None = None  # None = d_model
    n_layers: int = 2
    dropout: float = 0.2
    emb_dropout: float = 0.2


class LSTM(nn.Module):
    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        hidden = config.hidden_size or config.d_model
        if config.n_layers < 1 or hidden < 1:
            raise ValueError(f"n_layers and hidden_size must be >= 1, got {config.n_layers} and {hidden}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        # nn.LSTM's dropout acts between layers only (and warns when there is a single layer).
        self.lstm = nn.LSTM(config.d_model, hidden, config.n_layers, batch_first=True,
                            dropout=config.dropout if config.n_layers > 1 else 0.0)
        self.dropout = nn.Dropout(config.dropout)
        self.proj = nn.Linear(hidden, config.d_model) if hidden != config.d_model else nn.Identity()
        nn.init.normal_(self.item_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
            for name, param in self.lstm.named_parameters():
                if name.startswith("bias_ih"):
                    # Forget-gate bias 1 (Jozefowicz et al. 2015): the cell remembers by default
                    # early in training. PyTorch orders the gates input, forget, cell, output.
                    param[hidden : 2 * hidden].fill_(1.0)

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states (zero at padding)."""
        aligned, shift = left_align(item_ids)
        x = self.emb_dropout(self.item_emb(aligned))  # (B, T, D)
        out, _ = self.lstm(x)  # (B, T, hidden)
        out = self.proj(self.dropout(restore_alignment(out, shift)))
        return out * (item_ids != 0).unsqueeze(-1)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight
