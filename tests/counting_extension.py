"""A model extension for the engine's tests: it uses every hook of the seam
(:mod:`seqtrans.model.extension`) with state of both reorder kinds, and names no task.

Each source embedding gets a learned vector for whether its token is :data:`MARK`; each
decoder input gets a learned vector for how many :data:`MARK` tokens its prefix holds
(capped), plus a projection of its source's first encoder state.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target positions, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqtrans.model.extension import ROW, SENTENCE, ModelExtension, reorder_fields

MARK = 4  # the token the extension counts, on both sides
MOST = 3  # counts above this share one vector


@dataclass
class CountState:
    first: Tensor = field(metadata=SENTENCE)  # [B, D] the projected first encoder state
    count: Tensor = field(metadata=ROW)  # [N] marks in each hypothesis so far

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class CountingExtension(ModelExtension):
    limits = {"export": "counts marks, which no export format can"}

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.marked = nn.Embedding(2, d_model)
        self.counts = nn.Embedding(MOST + 1, d_model)
        self.first = nn.Linear(d_model, d_model, bias=False)

    def encoder_input(self, src: Tensor) -> Tensor:
        return self.marked((src == MARK).long())  # [B, S, D]

    def source_context(self, src: Tensor, memory: Tensor) -> Tensor:
        return self.first(memory[:, 0])  # [B, D]

    def _add(self, count: Tensor, first: Tensor) -> Tensor:
        """count [N, T], first [B, D] -> [N, T, D]"""
        sentence = torch.arange(count.size(0), device=count.device) // (count.size(0) // first.size(0))  # [N]
        return self.counts(count.clamp(max=MOST)) + first[sentence].unsqueeze(1)

    def decoder_input(self, tokens: Tensor, context: object) -> Tensor:
        assert isinstance(context, Tensor)
        return self._add((tokens == MARK).long().cumsum(1), context)

    def start(self, context: object, rows: int) -> CountState:
        assert isinstance(context, Tensor)
        return CountState(context, torch.zeros(rows, dtype=torch.long, device=context.device))

    def step(self, tokens: Tensor, state: object) -> Tensor:
        assert isinstance(state, CountState)
        count = (tokens == MARK).long().cumsum(1) + state.count.unsqueeze(1)  # [N, T]
        state.count = count[:, -1]
        return self._add(count, state.first)
