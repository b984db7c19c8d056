"""The source cursor (``model.source_cursor``): each decoder input also sees where its
output stands in the source.

For tasks whose outputs consume their inputs in order, the codec declares a
:class:`~seqtrans.tasks.SourceWalk`: the source is a sequence of units, each starting
at a source token of ``walk.starts``, and every target token of ``walk.advance``
consumes one unit. The decoder input at each position then carries, added to its
embedding, the projected encoder state of the first unit its prefix has not yet
consumed (zero once all are). Attention can find that unit only by counting; the
cursor hands it over. Counting needs only the tokens, so training (teacher forcing)
and incremental decoding compute the same inputs.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target positions (this call), U the most units of any source, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.common import ROW, SENTENCE, reorder_fields
from seqtrans.tasks.protocol import SourceWalk


@dataclass
class CursorState:
    """Where each hypothesis stands in its source's units, for incremental decoding."""

    units: Tensor = field(metadata=SENTENCE)  # [B, U+1, D]; row U (past the last unit) is zero
    position: Tensor = field(metadata=ROW)  # [N] units consumed so far

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class SourceCursor(nn.Module):
    """The walk's token sets as buffers and the projection of the units' encoder states."""

    starts: Tensor  # [starts] source ids that start a unit
    advance: Tensor  # [advance] target ids that consume one

    def __init__(self, d_model: int, walk: SourceWalk) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("starts", torch.tensor(sorted(walk.starts)), persistent=False)
        self.register_buffer("advance", torch.tensor(sorted(walk.advance)), persistent=False)

    def units(self, src: Tensor, memory: Tensor) -> Tensor:
        """The projected encoder states at the units' first tokens, in order, then zeros
        (every row holds U+1).  src [B, S], memory [B, S, D] -> [B, U+1, D]"""
        starts = torch.isin(src, self.starts)  # [B, S]
        count = starts.sum(1)  # [B]
        most = int(count.max()) if src.size(0) else 0
        # a stable sort of "is not a start" brings each row's start positions first, in order
        order = torch.sort((~starts).to(torch.uint8), dim=1, stable=True).indices[:, :most]  # [B, U]
        units = memory.gather(1, order.unsqueeze(-1).expand(-1, -1, memory.size(-1)))  # [B, U, D]
        units = units * (torch.arange(most, device=src.device) < count.unsqueeze(1)).unsqueeze(-1)
        return F.pad(self.proj(units), (0, 0, 0, 1))

    def start(self, units: Tensor, rows: int) -> CursorState:
        """The state of ``rows`` hypotheses (K per sentence) before any target token."""
        return CursorState(units, torch.zeros(rows, dtype=torch.long, device=units.device))

    def inputs(self, tokens: Tensor, units: Tensor, before: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """What each decoder input adds, and the units consumed after the last input.
        tokens [N, T], units [B, U+1, D], before [N] (consumed before these tokens) -> [N, T, D], [N]"""
        consumed = torch.isin(tokens, self.advance).cumsum(1)  # [N, T]
        if before is not None:
            consumed = consumed + before.unsqueeze(1)
        n, b = tokens.size(0), units.size(0)
        index = consumed.clamp(max=units.size(1) - 1)  # [N, T]
        if n != b:
            # K hypotheses per sentence (search, no gradient): pick each row's unit from its
            # sentence's units, without copying them K times at every step
            u, d = units.size(1), units.size(2)
            sentence = torch.arange(n, device=tokens.device) // (n // b)  # [N]
            flat = (sentence.unsqueeze(1) * u + index).flatten()  # [N*T] into [B*(U+1)]
            seen = units.reshape(b * u, d).index_select(0, flat).view(n, -1, d)  # [N, T, D]
            return seen, consumed[:, -1]
        # a gather, whose gradient (a scatter-add along one axis) sums in the same order in
        # every run; advanced indexing's gradient on the CPU does not
        seen = units.gather(1, index.unsqueeze(-1).expand(-1, -1, units.size(-1)))  # [N, T, D]
        return seen, consumed[:, -1]

    def step(self, tokens: Tensor, state: CursorState) -> Tensor:
        """The additions for the next tokens of each hypothesis; advances ``state``.
        tokens [N, T] -> [N, T, D]"""
        extra, state.position = self.inputs(tokens, state.units, state.position)
        return extra
