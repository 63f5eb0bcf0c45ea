"""TRM4Rec (the TRM4Rec study): a recursive transformer, B distinct blocks looped S times with shared weights.

Depth and parameters are decoupled: ``n_steps`` (S) sets the compute, ``n_blocks`` (B) the
parameters, so S4, S8 and S16 have the parameter count of one block and S4-B2 of two. The
blocks are this repo's causal RoPE/SwiGLU/RMSNorm ``Block``; a final RMSNorm follows the loop.

``adaptive`` adds ACT halting (Graves 2016) per position, with S as the step budget: a
halting unit (linear + sigmoid) reads each position's state after every step; a position
stops at the first step N where its cumulative halting probability reaches
``halt_threshold`` (or at S), and its output is the mix of its states weighted by the
halting probabilities, the remainder R = 1 - (sum of the first N - 1) going to step N.
The ponder cost ``ponder_cost * mean(N + R)`` over real positions is returned by
``auxiliary_loss()``, which the training loop adds to the loss. Halting reads a position's
own state only, and every state is causal, so halting keeps the model causal; positions
that halted keep being updated as keys and values for later positions, only their output
is frozen. The loop ends as soon as every real position has halted (for ``encode_last``,
as soon as every row's last position has), which is where the inference savings come from.
``last_average_steps`` holds the mean N over the positions the last forward returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from retriever.backbones.base import SequenceEncoder
from retriever.layers import Block, RMSNorm, attention_mask, init_weights, rope_tables


@dataclass(frozen=True)
class TRM4RecConfig:
    n_items: int
    max_len: int = 200
    d_model: int = 64
    n_heads: int = 2
    n_blocks: int = 1
    n_steps: int = 4
    dropout: float = 0.2
    emb_dropout: float = 0.2
    ffn_expansion: float = 4.0
    rope_base: float = 10_000.0
    adaptive: bool = False
    halt_threshold: float = 0.99
    ponder_cost: float = 0.01


class TRM4Rec(SequenceEncoder):
    def __init__(self, config: TRM4RecConfig) -> None:
        super().__init__()
        if config.n_steps < 1 or config.n_blocks < 1:
            raise ValueError(f"n_steps and n_blocks must be >= 1, got {config.n_steps} and {config.n_blocks}")
        if not 0.0 < config.halt_threshold <= 1.0:
            raise ValueError(f"halt_threshold must lie in (0, 1], got {config.halt_threshold}")
        if config.ponder_cost < 0:
            raise ValueError(f"ponder_cost must be >= 0, got {config.ponder_cost}")
        self.config = config
        self.item_emb = nn.Embedding(config.n_items + 1, config.d_model, padding_idx=0)
        self.emb_dropout = nn.Dropout(config.emb_dropout)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.ffn_expansion) for _ in range(config.n_blocks)
        )
        self.halt = nn.Linear(config.d_model, 1) if config.adaptive else None
        self.norm = RMSNorm(config.d_model)
        self.apply(init_weights)  # the transformer's, so S steps compare with S layers from the same start
        if self.halt is not None:
            # Graves 2016 / Universal Transformer: a positive bias starts every position at a
            # couple of steps instead of the full budget, so early training stays cheap.
            nn.init.constant_(self.halt.bias, 1.0)
        self.last_average_steps = float(config.n_steps)
        self._ponder: Tensor | None = None

    def forward(self, item_ids: Tensor) -> Tensor:
        """(B, T) item ids, 0 = padding -> (B, T, D) hidden states."""
        return self._run(item_ids, last_only=False)

    def encode_last(self, item_ids: Tensor) -> Tensor:
        """(B, T) -> (B, D): the last position only (it alone decides when adaptive halting stops)."""
        return self._run(item_ids, last_only=True)[:, -1]

    def item_embeddings(self) -> Tensor:
        """(n_items + 1, D) output table, shared with the input (row 0 = padding)."""
        return self.item_emb.weight

    def auxiliary_loss(self) -> Tensor:
        """The ponder cost of the latest training forward (0 when not adaptive), released once read.

        Released so that a second call, or a call after evaluation forwards, cannot add a stale
        cost (and keep a freed graph alive); eval-mode forwards never set it.
        """
        ponder, self._ponder = self._ponder, None
        if ponder is None:
            return self.item_emb.weight.new_zeros(())
        return self.config.ponder_cost * ponder

    def _run(self, item_ids: Tensor, *, last_only: bool) -> Tensor:
        T = item_ids.shape[1]
        head_dim = self.config.d_model // self.config.n_heads
        rope = rope_tables(T, head_dim, base=self.config.rope_base, device=item_ids.device)
        mask = attention_mask(item_ids, causal=True)
        state = self.emb_dropout(self.item_emb(item_ids))  # (B, T, D)
        if self.halt is None:
            n_steps = self.config.n_steps
            for step in range(n_steps):
                state = self._step(state, mask, rope, last_only=last_only and step == n_steps - 1)
            self.last_average_steps = float(n_steps)
            return self.norm(state)
        return self.norm(self._halting_loop(state, mask, rope, item_ids != 0, last_only=last_only))

    def _step(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor], *, last_only: bool) -> Tensor:
        """One recursion step: the B blocks in order; last_only narrows the final block to (B, 1, D)."""
        for i, block in enumerate(self.blocks):
            x = block(x, mask, rope, last_only=last_only and i == len(self.blocks) - 1)
        return x

    def _halting_loop(
        self, state: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor], real: Tensor, *, last_only: bool
    ) -> Tensor:
        """ACT over at most n_steps steps: (B, T, D) embeddings -> (B, T, D) halting-weighted states.

        real: (B, T) bool, False at padding (never run, output zero, left out of the averages).
        """
        assert self.halt is not None
        n_steps, threshold = self.config.n_steps, self.config.halt_threshold
        watched = real.clone()  # positions whose halting may end the loop: those returned
        if last_only:
            watched[:, :-1] = False
        running = real.clone()
        cumulative = torch.zeros(real.shape, device=real.device)  # sum of the halting probabilities used so far
        remainder = torch.zeros_like(cumulative)
        steps = torch.zeros_like(cumulative)  # N per position
        output = torch.zeros(state.shape, device=state.device)  # fp32 mix, whatever autocast does to state
        for step in range(1, n_steps + 1):
            state = self._step(state, mask, rope, last_only=False)
            p = torch.sigmoid(self.halt(state).squeeze(-1).float())  # (B, T)
            stops = running & ((cumulative + p >= threshold) | (step == n_steps))
            goes_on = running & ~stops
            weight = torch.where(goes_on, p, torch.where(stops, 1.0 - cumulative, 0.0))  # (B, T)
            output = output + weight.unsqueeze(-1) * state
            remainder = torch.where(stops, 1.0 - cumulative, remainder)
            steps = steps + running.float()
            cumulative = cumulative + torch.where(goes_on, p, 0.0)
            running = goes_on
            if not (running & watched).any():  # later steps would change no output we return
                break
        self.last_average_steps = float(steps[watched].mean()) if watched.any() else 0.0
        if self.training:
            self._ponder = (steps + remainder)[real].mean() if real.any() else output.new_zeros(())
        return output
