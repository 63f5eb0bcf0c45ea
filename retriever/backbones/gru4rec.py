"""GRU4Rec (Hidasi et al. 2016), in its RecBole form: item embeddings -> stacked GRU -> projection.

The output table is the input embedding table (as every backbone here), so the GRU's hidden
size may differ from d_model: a linear layer maps it back when it does. Causal by construction.

Left padding: a GRU fed leading padding does not stay at its zero initial state (its biases
move it), so the user vector would depend on how much padding a batch carries. Each row is
rolled so that its first item sits at t = 0, the GRU runs over the aligned rows, and the
outputs are rolled back; real positions then see exactly their own history, and the
positions that were padding (now computed from the trailing garbage) are zeroed. This keeps
the cuDNN kernel of ``nn.GRU`` without packing (no lengths copied to the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class GRU4RecConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    hidden_size: int | None = None  # None = d_model
    n_layers: int = 1
    dropout: float = 0.2
    emb_dropout: float = 0.2


class GRU4Rec(nn.Module):
    def __init__(self, config: GRU4RecConfig) -> None:
        super().__init__()
        hidden = config.hidden_size or config.d_model
        if config.n_layers < 1 or hidden < 1:
            raise ValueError(f"n_layers and hidden_size must be >= 1, got {config.n_layers} and {hidden}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        # nn.GRU's dropout acts between layers only (and warns when there is a single layer).
        self.gru = nn.GRU(config.d_model, hidden, config.n_layers, batch_first=True,
                          dropout=config.dropout if config.n_layers > 1 else 0.0)
        self.dropout = nn.Dropout(config.dropout)
        self.proj = nn.Linear(hidden, config.d_model) if hidden != config.d_model else nn.Identity()
        nn.init.normal_(self.item_emb.weight, std=0.02)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states (zero at padding)."""
        aligned, shift = left_align(item_ids)
        x = self.emb_dropout(self.item_emb(aligned))  # (B, T, D)
        out, _ = self.gru(x)  # (B, T, hidden)
        out = self.proj(self.dropout(restore_alignment(out, shift)))
        return out * (item_ids != 0).unsqueeze(-1)

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight


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
