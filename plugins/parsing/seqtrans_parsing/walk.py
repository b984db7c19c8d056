"""How parsing outputs walk over their inputs: what the cursors
(:mod:`seqtrans_parsing.cursor`) count. No torch here: the codec builds it when the task
is listed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceWalk:
    """How outputs walk over their inputs in order.

    The source is a sequence of units, each starting at a source token of ``starts``;
    every target token of ``advance`` consumes one unit. With the source cursor each
    decoder input also sees the encoder state of the first unit not yet consumed.

    Outputs that also build nested spans over the units declare ``opens`` and
    ``closes``: a target token of ``opens`` opens a span starting at the first unit not
    yet consumed, one of ``closes`` closes the innermost open span (a close with none
    open is ignored). With the span cursor each decoder input also sees the encoder
    state of the start of the innermost open span.
    """

    advance: tuple[int, ...]  # target ids
    starts: tuple[int, ...]  # source ids
    opens: tuple[int, ...] = ()  # target ids
    closes: tuple[int, ...] = ()  # target ids

    def __post_init__(self) -> None:
        if not self.advance or not self.starts:
            raise ValueError("a source walk needs at least one advancing target id and one "
                             "unit-start source id")
        if bool(self.opens) != bool(self.closes):
            raise ValueError("a source walk's spans need both opening and closing target ids")
        overlap = ({"advance and opens": set(self.advance) & set(self.opens),
                    "advance and closes": set(self.advance) & set(self.closes),
                    "opens and closes": set(self.opens) & set(self.closes)})
        for sets, ids in overlap.items():
            if ids:
                raise ValueError(f"a source walk's {sets} share target ids {sorted(ids)}")

    @property
    def spans(self) -> bool:
        """Whether the walk declares spans (``opens`` and ``closes``)."""
        return bool(self.opens)
