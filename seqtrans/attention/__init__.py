"""Attention mechanisms, one module per family, and the factory that builds them by name.

The engine has three attention sites, each configured by a ``model`` key:
``encoder_attention`` and ``decoder_attention`` (self-attention) and ``cross_attention``
(encoder-decoder attention). A site takes a module with the call signature of its
family: self-attention ``forward(x, mask=..., causal=..., cache=..., position_bias=...)``
with ``new_cache(rows, capacity, like=...)`` (a module that cannot add a position bias
to its logits refuses one); encoder-decoder attention
``prepare(memory, mask) -> state`` (once per source) then ``forward(x, state)``. Every
piece of per-sentence or per-hypothesis decoding state implements
``reorder(rows, sentences)``. See docs/attention.md for the mechanisms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from seqtrans.attention.additive import AdditiveScore
from seqtrans.attention.cache import KVCache
from seqtrans.attention.content import ContentCrossAttention, ContentSelfAttention
from seqtrans.attention.local import LocalAttention
from seqtrans.attention.lookback import LookbackAttention
from seqtrans.attention.luong import DotScore, GeneralScore, LocationScore
from seqtrans.attention.maps import AttentionMaps, Recorder
from seqtrans.attention.memory import MemoryAttention
from seqtrans.attention.monotonic import MonotonicAttention, SourceStream, selecting
from seqtrans.attention.multihead_monotonic import MultiheadMonotonicAttention
from seqtrans.attention.restricted import RestrictedSelfAttention
from seqtrans.attention.scaled_dot import CrossAttention, CrossState, SelfAttention, waiting
from seqtrans.config import DecodeConfig, ModelConfig

__all__ = ["CROSS_ATTENTION", "SELF_ATTENTION", "AttentionMaps", "CrossAttention", "CrossAttentionModule",
           "CrossState", "DecodingState", "KVCache", "Recorder", "SelfAttention", "SelfAttentionModule",
           "LatencyReporting", "SourceStream", "StreamingCrossAttention", "StartsFromScaledDot",
           "cross_attention", "reading", "selecting", "self_attention", "waiting"]


@contextmanager
def reading(decode: DecodeConfig) -> Iterator[None]:
    """Encoder-decoder attention prepared inside this block reads the source as ``decode``
    says: wait-k at ``decode.wait_k`` (:func:`waiting`), learned policies stopping at
    ``decode.monotonic_threshold`` (:func:`selecting`)."""
    with waiting(decode.wait_k or None), selecting(decode.monotonic_threshold):
        yield


class DecodingState(Protocol):
    """Per-sentence or per-hypothesis state that follows the search."""

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None: ...


class SelfAttentionModule(Protocol):
    def __call__(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                 cache: KVCache | None = None, position_bias: Tensor | None = None) -> Tensor: ...

    def new_cache(self, rows: int, capacity: int, *, like: Tensor) -> KVCache: ...


class CrossAttentionModule(Protocol):
    def __call__(self, x: Tensor, state: Any) -> Tensor: ...

    def prepare(self, memory: Tensor, mask: Tensor) -> DecodingState: ...


@runtime_checkable
class StreamingCrossAttention(Protocol):
    """Encoder-decoder attention that can decode while its source arrives: ``follow``
    makes a state that pulls encoder states from the source as they are needed."""

    def follow(self, source: SourceStream, *, like: Tensor) -> DecodingState: ...


@runtime_checkable
class StartsFromScaledDot(Protocol):
    """Encoder-decoder attention that can start from a trained scaled-dot one's weights
    (``run --init`` of a full-sentence model with another ``model.cross_attention``, as
    EMMA fine-tunes a read policy): ``adopt`` copies what corresponds, given the
    scaled-dot module's weights by name (``q.weight``, ``kv.weight``, ``out.weight`` and
    biases), and returns the names of its own parameters it set."""

    def adopt(self, weights: dict[str, Tensor]) -> list[str]: ...


@runtime_checkable
class LatencyReporting(Protocol):
    """Encoder-decoder attention whose training pass has expected delays for a latency loss:
    [N, T] for one monotonic head per layer (MILk), [N, H, T] for one per head (MMA)."""

    def take_delays(self) -> Tensor | None: ...


def _content_self(score: Callable[[ModelConfig], Any]) -> Callable[[ModelConfig], nn.Module]:
    return lambda c: ContentSelfAttention(score(c), c.d_model, dropout=c.attention_dropout)


def _content_cross(score: Callable[[ModelConfig], Any]) -> Callable[[ModelConfig], nn.Module]:
    return lambda c: ContentCrossAttention(score(c), c.d_model, dropout=c.attention_dropout)


def _dot(c: ModelConfig) -> DotScore:
    return DotScore(c.d_model, c.heads)


def _general(c: ModelConfig) -> GeneralScore:
    return GeneralScore(c.d_model, c.heads)


def _additive(c: ModelConfig) -> AdditiveScore:
    return AdditiveScore(c.d_model, c.heads)


def _location(c: ModelConfig) -> LocationScore:
    return LocationScore(c.d_model, c.heads, max_length=c.location_max_length)


def _lookback(c: ModelConfig, *, chunk: int | None) -> LookbackAttention:
    return LookbackAttention(c.d_model, c.heads, chunk=chunk, dim=c.monotonic_dim, noise=c.monotonic_noise,
                             r_init=c.monotonic_r_init, temperature=c.monotonic_temperature,
                             dropout=c.attention_dropout)


def _multihead_monotonic(c: ModelConfig, *, lookback: bool,
                         chunk: int | None = None) -> MultiheadMonotonicAttention:
    return MultiheadMonotonicAttention(c.d_model, c.heads, lookback=lookback, chunk=chunk,
                                       noise=c.monotonic_noise, r_init=c.monotonic_r_init,
                                       temperature=c.monotonic_temperature, dropout=c.attention_dropout)


# The score functions that attend in a multi-head module (seqtrans.attention.content) at
# either site, by their config name.
SCORES: dict[str, Callable[[ModelConfig], Any]] = {
    "dot": _dot, "general": _general, "additive": _additive, "location": _location,
}

# The mechanisms of each site, by their config name.
SELF_ATTENTION: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "scaled_dot": lambda c: SelfAttention(c.d_model, c.heads, dropout=c.attention_dropout,
                                          head_dim=c.head_dim, bias=c.bias, scaled=c.attention_scale,
                                          relative=c.positions == "relative"),
    **{name: _content_self(score) for name, score in SCORES.items()},
    "restricted": lambda c: RestrictedSelfAttention(c.d_model, c.heads, radius=c.restricted_radius,
                                                    dropout=c.attention_dropout),
}

CROSS_ATTENTION: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "scaled_dot": lambda c: CrossAttention(c.d_model, c.heads, dropout=c.attention_dropout, lag=c.wait_k,
                                           head_dim=c.head_dim, bias=c.bias, scaled=c.attention_scale),
    **{name: _content_cross(score) for name, score in SCORES.items()},
    "local": lambda c: LocalAttention(c.d_model, c.heads, window=c.local_window,
                                      alignment=c.local_alignment, dropout=c.attention_dropout),
    "memory": lambda c: MemoryAttention(c.d_model, slots=c.memory_slots, encoder_score=c.memory_encoder_score,
                                        decoder_score=c.memory_decoder_score, positions=c.memory_positions,
                                        heads=c.memory_heads, local_width=c.memory_local_width),
    "monotonic": lambda c: MonotonicAttention(c.d_model, dim=c.monotonic_dim, noise=c.monotonic_noise,
                                              r_init=c.monotonic_r_init, temperature=c.monotonic_temperature),
    "milk": lambda c: _lookback(c, chunk=None),
    "mocha": lambda c: _lookback(c, chunk=c.chunk_size),
    "mma_hard": lambda c: _multihead_monotonic(c, lookback=False),
    "mma_il": lambda c: _multihead_monotonic(c, lookback=True),
    "mma_chunk": lambda c: _multihead_monotonic(c, lookback=True, chunk=c.chunk_size),
}


def self_attention(name: str, config: ModelConfig) -> SelfAttentionModule:
    """The self-attention module ``name`` (a key of :data:`SELF_ATTENTION`) for ``config``."""
    module: Any = _build(SELF_ATTENTION, "self-attention", name, config)
    return module


def cross_attention(name: str, config: ModelConfig) -> CrossAttentionModule:
    """The encoder-decoder attention module ``name`` (a key of :data:`CROSS_ATTENTION`)."""
    module: Any = _build(CROSS_ATTENTION, "encoder-decoder", name, config)
    return module


def _build(table: Mapping[str, Callable[[ModelConfig], nn.Module]], kind: str, name: str,
           config: ModelConfig) -> nn.Module:
    try:
        build = table[name]
    except KeyError:
        raise ValueError(f"no {kind} mechanism '{name}'; known: {', '.join(table)}") from None
    return build(config)
