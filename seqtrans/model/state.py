"""What encoding and incremental decoding keep: the encoder's output (:class:`Encoded`),
the decoder's state between steps (:class:`DecoderState`), which follows the search's
reordering, and a causal encoder's caches for a source that arrives token by token
(:class:`EncoderState`).

Shapes: B sentences, N = B*K rows (K hypotheses per sentence), S source length, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from seqtrans.attention import DecodingState, KVCache
from seqtrans.model.extension import ExtensionState


@dataclass
class Encoded:
    """The encoder's output for a batch of sources."""

    memory: Tensor  # [B, S, D]
    mask: Tensor  # [B, S], True at real tokens
    # what each model extension keeps of the sources (ModelExtension.source_context), by name
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecoderState:
    """Everything incremental decoding keeps between steps, for N = B*K hypotheses."""

    caches: list[KVCache]  # per layer: self-attention keys/values so far
    cross: list[DecodingState]  # per layer: what cross-attention keeps of the source
    length: int = 0  # target positions decoded so far
    extensions: dict[str, ExtensionState] = field(default_factory=dict)  # by extension name

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Follow the search: keep hypotheses ``rows`` [N'] and sentences ``sentences`` [B']."""
        for cache, cross in zip(self.caches, self.cross):
            cache.reorder(rows, sentences)
            cross.reorder(rows, sentences)
        for state in self.extensions.values():
            state.reorder(rows, sentences)


@dataclass
class EncoderState:
    """A causal encoder's self-attention caches, for sources that arrive token by token."""

    caches: list[KVCache]  # per layer
    length: int = 0  # source positions encoded so far
