"""Attention weights as data, computed only when asked for
(:func:`seqtrans.model.transformer.attention_maps`).

Each mechanism reports its weights with a ``weights`` method that recomputes them from
the inputs its forward pass reads: nothing is kept on modules, and a forward pass that
was not asked for maps does no extra work. A :class:`Recorder` passed down the layers'
forward calls collects them, layer by layer.

- self-attention: ``weights(x [B, T, D], *, mask=[B, T] | None, causal=bool) -> [B, H, T, T]``,
  and ``position_bias=[1, H, T, T]`` where the model adds one (``model.positions=relative``)
- encoder-decoder: ``weights(x [B, T, D], memory [B, S, D], mask [B, S]) -> CrossWeights``:
  ``[B, H, T, S]`` for mechanisms that attend over source positions, :class:`MemoryWeights`
  for memory attention, :class:`MonotonicWeights` for monotonic attention (one monotonic head
  per layer) and :class:`HeadMonotonicWeights` for monotonic multihead attention.

Weights are those of the model's mode (call ``eval()`` for test time) without dropout.

Shapes: B sentences, S source, T target, H heads, D model, M memory slots (Britz et al.'s K).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

from torch import Tensor

from seqtrans.errors import UsageError


class NoAttentionWeights(UsageError):
    """An attention module that cannot report its weights."""


@dataclass(frozen=True)
class MemoryWeights:
    """Memory attention (Britz et al. 2017): each decoder step's weights beta over the M
    contexts, and the encoder's weights alpha that make each context from the source."""

    contexts: Tensor  # [B, T, M]: beta, per target step
    source: Tensor  # [B, M, S]: alpha transposed; row k is context k's weights over positions


@dataclass(frozen=True)
class MonotonicWeights:
    """Monotonic attention (Raffel et al. 2017): the hard alignment used at test time and
    the expected alignment used in training (without the training noise)."""

    positions: Tensor  # [B, T] (long): the source position each step attends; the source length if none
    expected: Tensor  # [B, T, S]: alpha_ij, eq. 9-14
    probabilities: Tensor | None = None  # [B, T, S]: p_ij = sigmoid(e_ij), zero at padding


@dataclass(frozen=True)
class HeadMonotonicWeights:
    """Monotonic multihead attention (Ma et al. 2020): per head, where it stops at test time,
    its expected alignment and selection probabilities, and the attention it pays (the
    expected alignment for MMA-H, the expected soft attention for MMA-IL)."""

    positions: Tensor  # [B, H, T] (long): where each head stops; the last position if it selects none
    expected: Tensor  # [B, H, T, S]: alpha_ijh with mass preservation
    probabilities: Tensor  # [B, H, T, S]: p_ijh, zero at padding
    attention: Tensor  # [B, H, T, S]


CrossWeights = Tensor | MemoryWeights | MonotonicWeights | HeadMonotonicWeights


@dataclass(frozen=True)
class AttentionMaps:
    """The attention weights of one teacher-forced pass, per layer, bottom first."""

    encoder: list[Tensor]  # per encoder layer: self-attention [B, H, S, S]
    decoder: list[Tensor]  # per decoder layer: causal self-attention [B, H, T, T]
    cross: list[CrossWeights]  # per decoder layer: encoder-decoder attention


@runtime_checkable
class SelfWeights(Protocol):
    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False) -> Tensor: ...


@runtime_checkable
class EncoderDecoderWeights(Protocol):
    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> CrossWeights: ...


@dataclass
class Recorder:
    """Collects the weights of every attention a forward pass runs through. The decoder's
    encoder-decoder weights are computed against ``memory`` [B, S, D] and ``mask`` [B, S],
    set before decoding."""

    memory: Tensor | None = None
    mask: Tensor | None = None
    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[CrossWeights] = field(default_factory=list)

    def encoder_self(self, module: object, x: Tensor, *, mask: Tensor | None, causal: bool,
                     position_bias: Tensor | None = None) -> None:
        self.encoder.append(_weights(module, x, mask=mask, causal=causal, position_bias=position_bias))

    def decoder_self(self, module: object, x: Tensor, *, position_bias: Tensor | None = None) -> None:
        self.decoder.append(_weights(module, x, mask=None, causal=True, position_bias=position_bias))

    def encoder_decoder(self, module: object, x: Tensor) -> None:
        if self.memory is None or self.mask is None:
            raise ValueError("the recorder needs the encoder output (memory, mask) before decoding")
        if not isinstance(module, EncoderDecoderWeights):
            raise NoAttentionWeights(f"{type(module).__name__} does not report its attention weights")
        self.cross.append(module.weights(x, self.memory, self.mask))

    def maps(self) -> AttentionMaps:
        return AttentionMaps(self.encoder, self.decoder, self.cross)


class BiasedSelfWeights(Protocol):
    """Self-attention whose logits take a position bias (``model.positions=relative``)."""

    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                position_bias: Tensor | None = None) -> Tensor: ...


def _weights(module: object, x: Tensor, *, mask: Tensor | None, causal: bool,
             position_bias: Tensor | None) -> Tensor:
    if not isinstance(module, SelfWeights):
        raise NoAttentionWeights(f"{type(module).__name__} does not report its attention weights")
    if position_bias is None:
        return module.weights(x, mask=mask, causal=causal)
    return cast(BiasedSelfWeights, module).weights(x, mask=mask, causal=causal, position_bias=position_bias)
