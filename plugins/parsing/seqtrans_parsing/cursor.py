"""The source cursor (``data.source_cursor``): each decoder input also sees where its
output stands in the source. A model extension (:class:`seqtrans.plugin.ModelExtension`).

Parsing outputs consume their inputs in order, which the codec declares as a
:class:`SourceWalk`: the source is a sequence of units (words), each starting at a
source token of ``walk.starts``, and every target token of ``walk.advance`` (a
preterminal) consumes one unit. The decoder input at each position then carries, added to its
embedding, the projected encoder state of the first unit its prefix has not yet
consumed (zero once all are). Attention can find that unit only by counting; the
cursor hands it over. Counting needs only the tokens, so training (teacher forcing)
and incremental decoding compute the same inputs.

The span cursor (``data.span_cursor``) is a second, independent signal for outputs
that also build nested spans over the units (the walk's ``opens`` and ``closes``): each
decoder input carries, added to its embedding and projected separately, the encoder
state of the unit where the innermost span its prefix has opened and not closed starts
(zero when none is open or it starts past the last unit). Teacher forcing finds that
span for all positions at once; incremental decoding keeps a stack per hypothesis.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target positions (this call), U the most units of any source, D d_model, M the
room on a hypothesis's stack of open spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.plugin import ROW, SENTENCE, Feature, ModelExtension, reorder_fields
from seqtrans_parsing.walk import SourceWalk

# both cursors count units in the whole encoded source
_LIMITS: dict[Feature, str] = {
    "stream": "finds the source's words in the whole encoded source, which a stream does not have "
              "while decoding (train without data.source_cursor and data.span_cursor to stream)",
    "export": "adds the encoder state of a source word to each decoder input, which CTranslate2's "
              "decoder has no input for",
}


@dataclass
class CursorState:
    """Where each hypothesis stands in its source's units, for incremental decoding."""

    units: Tensor = field(metadata=SENTENCE)  # [B, U+1, D]; row U (past the last unit) is zero
    position: Tensor = field(metadata=ROW)  # [N] units consumed so far

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class SourceCursor(ModelExtension):
    """The walk's token sets as buffers and the projection of the units' encoder states."""

    limits = _LIMITS

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
        return F.pad(self.proj(unit_states(src, memory, self.starts)), (0, 0, 0, 1))

    def start(self, context: object, rows: int) -> CursorState:
        """The state of ``rows`` hypotheses (K per sentence) before any target token."""
        units = _units(context)
        return CursorState(units, torch.zeros(rows, dtype=torch.long, device=units.device))

    def inputs(self, tokens: Tensor, units: Tensor, before: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """What each decoder input adds, and the units consumed after the last input.
        tokens [N, T], units [B, U+1, D], before [N] (consumed before these tokens) -> [N, T, D], [N]"""
        consumed = torch.isin(tokens, self.advance).cumsum(1)  # [N, T]
        if before is not None:
            consumed = consumed + before.unsqueeze(1)
        index = consumed.clamp(max=units.size(1) - 1)  # [N, T]
        return pick(units, index), consumed[:, -1]

    def step(self, tokens: Tensor, state: object) -> Tensor:
        """The additions for the next tokens of each hypothesis; advances ``state``.
        tokens [N, T] -> [N, T, D]"""
        if not isinstance(state, CursorState):
            raise TypeError("the source cursor steps from the CursorState its start() made")
        extra, state.position = self.inputs(tokens, state.units, state.position)
        return extra

    # the extension's hooks (seqtrans.plugin.ModelExtension): the units are its source context
    def source_context(self, src: Tensor, memory: Tensor) -> Tensor:
        return self.units(src, memory)

    def decoder_input(self, tokens: Tensor, context: object) -> Tensor:
        return self.inputs(tokens, _units(context))[0]


def unit_states(src: Tensor, memory: Tensor, starts: Tensor) -> Tensor:
    """The encoder states at the units' first tokens (source ids ``starts``), in order,
    zero past a row's last unit.  src [B, S], memory [B, S, D] -> [B, U, D]"""
    is_start = torch.isin(src, starts)  # [B, S]
    count = is_start.sum(1)  # [B]
    most = int(count.max()) if src.size(0) else 0
    # a stable sort of "is not a start" brings each row's start positions first, in order
    order = torch.sort((~is_start).to(torch.uint8), dim=1, stable=True).indices[:, :most]  # [B, U]
    units = memory.gather(1, order.unsqueeze(-1).expand(-1, -1, memory.size(-1)))  # [B, U, D]
    return units * (torch.arange(most, device=src.device) < count.unsqueeze(1)).unsqueeze(-1)


def pick(units: Tensor, index: Tensor) -> Tensor:
    """Each row's unit ``index`` [N, T] from its sentence's units [B, U+1, D] (N = B*K,
    K hypotheses per sentence, side by side).  -> [N, T, D]"""
    n, b = index.size(0), units.size(0)
    if n != b:
        # K hypotheses per sentence (search, no gradient): pick each row's unit from its
        # sentence's units, without copying them K times at every step
        u, d = units.size(1), units.size(2)
        sentence = torch.arange(n, device=index.device) // (n // b)  # [N]
        flat = (sentence.unsqueeze(1) * u + index).flatten()  # [N*T] into [B*(U+1)]
        return units.reshape(b * u, d).index_select(0, flat).view(n, -1, d)  # [N, T, D]
    # a gather, whose gradient (a scatter-add along one axis) sums in the same order in
    # every run; advanced indexing's gradient on the CPU does not
    return units.gather(1, index.unsqueeze(-1).expand(-1, -1, units.size(-1)))  # [N, T, D]


@dataclass
class SpanState:
    """The open spans of each hypothesis, for incremental decoding."""

    units: Tensor = field(metadata=SENTENCE)  # [B, U+1, D]; row U (past the last unit) is zero
    position: Tensor = field(metadata=ROW)  # [N] units consumed so far
    stack: Tensor = field(metadata=ROW)  # [N, M] start units of the open spans, outermost first
    depth: Tensor = field(metadata=ROW)  # [N] spans open
    # tokens so far, a bound on the depth known without asking the device: the stack
    # grows by it
    seen: int = 0

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class SpanCursor(ModelExtension):
    """The walk's token sets as buffers and the projection of the units' encoder states,
    for the start of the innermost open span."""

    limits = _LIMITS

    starts: Tensor  # [starts] source ids that start a unit
    advance: Tensor  # [advance] target ids that consume one
    opens: Tensor  # [opens] target ids that open a span
    closes: Tensor  # [closes] target ids that close the innermost one

    def __init__(self, d_model: int, walk: SourceWalk) -> None:
        super().__init__()
        if not walk.spans:
            raise ValueError("a span cursor needs a walk that declares spans (opens and closes)")
        self.proj = nn.Linear(d_model, d_model, bias=False)
        for name in ("starts", "advance", "opens", "closes"):
            self.register_buffer(name, torch.tensor(sorted(getattr(walk, name))), persistent=False)

    def units(self, src: Tensor, memory: Tensor) -> Tensor:
        """The projected encoder states at the units' first tokens, in order, then zeros
        (every row holds U+1).  src [B, S], memory [B, S, D] -> [B, U+1, D]"""
        return F.pad(self.proj(unit_states(src, memory, self.starts)), (0, 0, 0, 1))

    def span_starts(self, tokens: Tensor) -> Tensor:
        """The unit where the innermost span open after each token starts, -1 where none
        is open; from no token before.  tokens [N, T] -> [N, T]"""
        opens = torch.isin(tokens, self.opens)  # [N, T]
        level = (opens.long() - torch.isin(tokens, self.closes).long()).cumsum(1)  # [N, T]
        # a close with nothing open is ignored: depth_t = max(0, depth_{t-1} + step_t),
        # which is the level less its lowest point so far below zero
        depth = level - level.cummin(1).values.clamp(max=0)  # [N, T]
        # the innermost span open after t was opened by the last opening j <= t of the
        # same depth: had that span closed since, a later opening would have climbed back
        t = torch.arange(tokens.size(1), device=tokens.device)
        # [N, T (after token t), T (opening j)]
        same = opens.unsqueeze(1) & (depth.unsqueeze(2) == depth.unsqueeze(1)) & (t.unsqueeze(1) >= t)
        opened = (same * (t + 1)).amax(2)  # [N, T] 1 + where the innermost span opened; 0: none
        # an opening consumes no unit: the units consumed after it are those before it
        consumed = torch.isin(tokens, self.advance).cumsum(1)  # [N, T]
        start = consumed.gather(1, (opened - 1).clamp(min=0))  # [N, T]
        return torch.where(depth > 0, start, -1)

    def start(self, context: object, rows: int, room: int = 16) -> SpanState:
        """The state of ``rows`` hypotheses (K per sentence) before any target token."""
        units = _units(context)
        zeros = torch.zeros(rows, dtype=torch.long, device=units.device)
        return SpanState(units, zeros, zeros.new_zeros(rows, room), zeros.clone())

    def inputs(self, tokens: Tensor, units: Tensor) -> Tensor:
        """What each decoder input of whole targets adds.
        tokens [N, T], units [B, U+1, D] -> [N, T, D]"""
        return self._seen(self.span_starts(tokens), units)

    def source_context(self, src: Tensor, memory: Tensor) -> Tensor:
        return self.units(src, memory)

    def decoder_input(self, tokens: Tensor, context: object) -> Tensor:
        return self.inputs(tokens, _units(context))

    def step(self, tokens: Tensor, state: object) -> Tensor:
        """The additions for the next tokens of each hypothesis; advances ``state``.
        tokens [N, T] -> [N, T, D]"""
        if not isinstance(state, SpanState):
            raise TypeError("the span cursor steps from the SpanState its start() made")
        starts = []
        for token in tokens.unbind(1):  # [N] each
            if state.stack.size(1) <= state.seen:
                state.stack = F.pad(state.stack, (0, state.stack.size(1)))  # [N, 2M]
            opens = torch.isin(token, self.opens)
            closes = torch.isin(token, self.closes) & (state.depth > 0)
            top = state.depth.unsqueeze(1)  # [N, 1] the slot above the innermost open span
            pushed = torch.where(opens.unsqueeze(1), state.position.unsqueeze(1), state.stack.gather(1, top))
            state.stack = state.stack.scatter(1, top, pushed)
            state.depth = state.depth + opens.long() - closes.long()
            state.position = state.position + torch.isin(token, self.advance).long()
            state.seen += 1
            innermost = state.stack.gather(1, (state.depth - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
            starts.append(torch.where(state.depth > 0, innermost, -1))
        return self._seen(torch.stack(starts, 1), state.units)  # [N, T] -> [N, T, D]

    def _seen(self, starts: Tensor, units: Tensor) -> Tensor:
        """starts [N, T] (-1: no span open) -> the projected states [N, T, D], zero where
        no span is open or it starts past the last unit"""
        past = units.size(1) - 1
        return pick(units, torch.where(starts < 0, past, starts.clamp(max=past)))


def _units(context: object) -> Tensor:
    if not isinstance(context, Tensor):
        raise TypeError("a cursor needs the units its source_context() computed from the encoder's output")
    return context
