"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), section 3.

``encode()`` and ``decode()`` are separate steps: search encodes once, then calls
``decode()`` one token at a time with a :class:`DecoderState` holding the
self-attention key/value caches and the encoder-decoder keys/values computed once
per source.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target length (this call), D d_model, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention import (
    AttentionMaps,
    DecodingState,
    KVCache,
    Recorder,
    SourceStream,
    StreamingCrossAttention,
    cross_attention,
    self_attention,
)
from seqtrans.config import ModelConfig
from seqtrans.cursor import CursorState, SourceCursor, SpanCursor, SpanState
from seqtrans.dropout import Dropout
from seqtrans.errors import ConfigError
from seqtrans.linear.fp32 import output_projection
from seqtrans.masks import padding_mask
from seqtrans.tasks.protocol import Codec, SourceVectoring, SourceVectors, SourceWalk, SourceWalking
from seqtrans.vocab import PAD


class Positions(nn.Module):
    """Sinusoidal (paper, section 3.5) or learned (Table 3, row E) position encodings."""

    inv_freq: Tensor

    def __init__(self, kind: str, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.kind = kind
        self.max_positions = max_positions
        if kind == "learned":
            self.table = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.table.weight, std=d_model**-0.5)
        else:
            # PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...)
            inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, length: int, *, offset: int = 0, device: torch.device) -> Tensor:
        """The encodings of positions offset .. offset+length-1.  -> [T, D]"""
        if self.kind == "learned":
            if offset + length > self.max_positions:
                raise ValueError(
                    f"position {offset + length - 1} is beyond model.max_positions="
                    f"{self.max_positions} of the learned position embeddings"
                )
            return self.table(torch.arange(offset, offset + length, device=device))
        pos = torch.arange(offset, offset + length, device=device, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq[None, :]  # [T, D/2]
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # [T, D] interleaved


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, *, dropout: float) -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, d_ff)
        self.outer = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)
        for lin in (self.inner, self.outer):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(F.relu(self.inner(x))))


class Residual(nn.Module):
    """Dropout, residual connection and LayerNorm around one sub-layer: post-norm
    ``LN(x + drop(f(x)))`` as in the paper, or pre-norm ``x + drop(f(LN(x)))``."""

    def __init__(self, d_model: int, *, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer_out)
        return self.norm(x + self.dropout(sublayer_out))

    def input(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: LN(x) for pre-norm, x itself for post-norm."""
        return self.norm(x) if self.pre_norm else x


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        pre = c.norm == "pre"
        self.self_attn = self_attention(c.encoder_attention, c)
        self.causal = c.causal_encoder
        self.ffn = FeedForward(c.d_model, c.d_ff, dropout=c.activation_dropout)
        self.r1 = Residual(c.d_model, dropout=c.dropout, pre_norm=pre)
        self.r2 = Residual(c.d_model, dropout=c.dropout, pre_norm=pre)

    def forward(self, x: Tensor, mask: Tensor | None, *, cache: KVCache | None = None,
                record: Recorder | None = None) -> Tensor:
        """x [B, S, D], mask [B, S] -> [B, S, D]; a causal encoder may extend a cache."""
        h = self.r1.input(x)
        if record is not None:
            record.encoder_self(self.self_attn, h, mask=mask, causal=self.causal)
        x = self.r1(x, self.self_attn(h, mask=mask, causal=self.causal, cache=cache))
        return self.r2(x, self.ffn(self.r2.input(x)))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        pre = c.norm == "pre"
        self.self_attn = self_attention(c.decoder_attention, c)
        self.cross_attn = cross_attention(c.cross_attention, c)
        self.ffn = FeedForward(c.d_model, c.d_ff, dropout=c.activation_dropout)
        self.r1 = Residual(c.d_model, dropout=c.dropout, pre_norm=pre)
        self.r2 = Residual(c.d_model, dropout=c.dropout, pre_norm=pre)
        self.r3 = Residual(c.d_model, dropout=c.dropout, pre_norm=pre)

    def forward(self, x: Tensor, cross: DecodingState, *, cache: KVCache | None = None,
                record: Recorder | None = None) -> Tensor:
        """x [N, T, D] -> [N, T, D]"""
        h = self.r1.input(x)
        if record is not None:
            record.decoder_self(self.self_attn, h)
        x = self.r1(x, self.self_attn(h, causal=True, cache=cache))
        h = self.r2.input(x)
        if record is not None:
            record.encoder_decoder(self.cross_attn, h)
        x = self.r2(x, self.cross_attn(h, cross))
        return self.r3(x, self.ffn(self.r3.input(x)))


@dataclass
class Encoded:
    """The encoder's output for a batch of sources."""

    memory: Tensor  # [B, S, D]
    mask: Tensor  # [B, S], True at real tokens
    units: Tensor | None = None  # [B, U+1, D] the source cursor's units (model.source_cursor)
    span_units: Tensor | None = None  # [B, U+1, D] the span cursor's units (model.span_cursor)


@dataclass
class DecoderState:
    """Everything incremental decoding keeps between steps, for N = B*K hypotheses."""

    caches: list[KVCache]  # per layer: self-attention keys/values so far
    cross: list[DecodingState]  # per layer: what cross-attention keeps of the source
    length: int = 0  # target positions decoded so far
    cursor: CursorState | None = None
    span: SpanState | None = None

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Follow the search: keep hypotheses ``rows`` [N'] and sentences ``sentences`` [B']."""
        for cache, cross in zip(self.caches, self.cross):
            cache.reorder(rows, sentences)
            cross.reorder(rows, sentences)
        if self.cursor is not None:
            self.cursor.reorder(rows, sentences)
        if self.span is not None:
            self.span.reorder(rows, sentences)


@dataclass
class EncoderState:
    """A causal encoder's self-attention caches, for sources that arrive token by token."""

    caches: list[KVCache]  # per layer
    length: int = 0  # source positions encoded so far


class VectorInput(nn.Module):
    """Fixed source vectors (:class:`SourceVectors`), projected to the model's width.

    Only the projection is a parameter: the vectors come from the codec wherever the
    model is built, so checkpoints stay the size of the model.
    ``forward(src [B, S]) -> [B, S, D]``"""

    def __init__(self, vectors: SourceVectors, d_model: int) -> None:
        super().__init__()
        self.vectors = vectors
        self.proj = nn.Linear(vectors.dim, d_model)

    def forward(self, src: Tensor) -> Tensor:
        found = torch.from_numpy(self.vectors.lookup(src.tolist()))
        return cast(Tensor, self.proj(found.to(src.device, self.proj.weight.dtype)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    ``forward(src [B, S], tgt_in [B, T]) -> logits [B, T, V]`` for training;
    ``encode`` / ``start`` / ``decode`` for search; ``start_encoding`` / ``encode_next``
    and ``start_streaming`` for sources that arrive while decoding (a causal encoder).

    With ``walk`` and ``model.source_cursor``, each decoder input also carries the
    projected encoder state of the first source unit not yet consumed; with
    ``model.span_cursor`` (a walk that declares spans), that of the first unit of the
    innermost span the output has opened and not closed (:mod:`seqtrans.cursor`). With
    ``vectors`` and ``model.source_vectors``, each source embedding also gets the
    projected fixed vector of its position (:class:`VectorInput`).
    """

    def __init__(self, config: ModelConfig, *, source_vocab_size: int, target_vocab_size: int,
                 shared_vocab: bool, walk: SourceWalk | None = None,
                 vectors: SourceVectors | None = None) -> None:
        super().__init__()
        c = self.config = config
        if c.source_cursor and walk is None:
            raise ConfigError("model.source_cursor", "this task's codec declares no walk over its source")
        if c.span_cursor and (walk is None or not walk.spans):
            raise ConfigError("model.span_cursor", "this task's codec declares no walk over its source"
                              if walk is None else "this task's walk over its source declares no spans "
                              "(SourceWalk.opens and closes)")
        if c.source_vectors and vectors is None:
            raise ConfigError("model.source_vectors", "this task's codec offers no source vectors")
        self.scale = math.sqrt(c.d_model)
        self.target_embed = nn.Embedding(target_vocab_size, c.d_model, padding_idx=PAD)
        nn.init.normal_(self.target_embed.weight, std=c.d_model**-0.5)
        nn.init.zeros_(self.target_embed.weight[PAD])
        if shared_vocab and c.share_embeddings:
            self.source_embed = self.target_embed
        else:
            self.source_embed = nn.Embedding(source_vocab_size, c.d_model, padding_idx=PAD)
            nn.init.normal_(self.source_embed.weight, std=c.d_model**-0.5)
            nn.init.zeros_(self.source_embed.weight[PAD])
        self.positions = Positions(c.positions, c.d_model, c.max_positions)
        self.dropout = Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        pre = c.norm == "pre"
        # pre-norm leaves the stacks' outputs unnormalised: one final LayerNorm each
        self.encoder_norm = nn.LayerNorm(c.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if pre else nn.Identity()
        self.output: nn.Linear | None = None
        if not c.tie_output:
            self.output = nn.Linear(c.d_model, target_vocab_size, bias=False)
            nn.init.normal_(self.output.weight, std=c.d_model**-0.5)
        self.cursor = SourceCursor(c.d_model, walk) if c.source_cursor and walk is not None else None
        self.span_cursor = SpanCursor(c.d_model, walk) if c.span_cursor and walk is not None else None
        self.vectors = VectorInput(vectors, c.d_model) if c.source_vectors and vectors is not None else None
        # a decoding-only replacement of ``x @ output_weight.T`` (seqtrans.quantize); never trained
        self.projection: nn.Module | None = None

    @property
    def encoder_layers(self) -> list[EncoderLayer]:
        return cast(list[EncoderLayer], list(self.encoder))

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.decoder))

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a shared embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    def _embed(self, embed: nn.Embedding, tokens: Tensor, offset: int, extra: Tensor | None = None) -> Tensor:
        x = embed(tokens) * self.scale  # [N, T, D]
        x = x + self.positions(tokens.size(1), offset=offset, device=tokens.device).to(x.dtype)
        if extra is not None:
            x = x + extra
        return self.dropout(x)

    def encode(self, src: Tensor, *, record: Recorder | None = None) -> Encoded:
        """src [B, S] (padded with PAD) -> memory [B, S, D]; ``record`` collects the
        self-attention weights of each layer."""
        mask = padding_mask(src, PAD)  # [B, S]
        x = self._embed(self.source_embed, src, 0, self.vectors(src) if self.vectors is not None else None)
        for layer in self.encoder:
            x = layer(x, mask, record=record)
        memory = self.encoder_norm(x)
        units = self.cursor.units(src, memory) if self.cursor is not None else None
        spans = self.span_cursor.units(src, memory) if self.span_cursor is not None else None
        return Encoded(memory, mask, units, spans)

    def start_encoding(self, *, rows: int = 1, capacity: int = 64) -> EncoderState:
        """An empty incremental encoding of ``rows`` sources (``model.causal_encoder``)."""
        if not self.config.causal_encoder:
            raise ValueError("incremental encoding needs a causal encoder (model.causal_encoder)")
        like = self.target_embed.weight
        return EncoderState([layer.self_attn.new_cache(rows, capacity, like=like)
                             for layer in self.encoder_layers])

    def encode_next(self, tokens: Tensor, state: EncoderState) -> Tensor:
        """The encoder states of the next source tokens, after those in ``state``, which is
        updated. A causal encoder gives every position the state it has in ``encode()``
        of the whole source.  tokens [B, S'] (no padding) -> [B, S', D]"""
        if self.vectors is not None:
            # a position's vector may depend on tokens that have not arrived (a word's later pieces)
            raise ValueError("a model with source vectors (model.source_vectors) encodes whole sources only")
        x = self._embed(self.source_embed, tokens, state.length)
        for layer, cache in zip(self.encoder, state.caches):
            x = layer(x, None, cache=cache)
        state.length += tokens.size(1)
        return self.encoder_norm(x)

    def start(self, encoded: Encoded, *, beam: int = 1, capacity: int = 64) -> DecoderState:
        """A fresh decoding state for ``beam`` hypotheses per source, room for ``capacity`` tokens."""
        rows = encoded.memory.size(0) * beam
        cursor = span = None
        if self.cursor is not None:
            cursor = self.cursor.start(_units(encoded), rows)
        if self.span_cursor is not None:
            span = self.span_cursor.start(_span_units(encoded), rows)
        return DecoderState(
            caches=[layer.self_attn.new_cache(rows, capacity, like=encoded.memory)
                    for layer in self.decoder_layers],
            cross=[layer.cross_attn.prepare(encoded.memory, encoded.mask) for layer in self.decoder_layers],
            cursor=cursor,
            span=span,
        )

    def start_streaming(self, source: SourceStream, *, capacity: int = 64) -> DecoderState:
        """A decoding state for one hypothesis over a source that arrives while decoding:
        each layer's encoder-decoder attention pulls encoder states from ``source`` as it
        needs them. Needs a cross-attention that can follow a stream (monotonic)."""
        like = self.target_embed.weight
        cross: list[DecodingState] = []
        for layer in self.decoder_layers:
            attn = layer.cross_attn
            if not isinstance(attn, StreamingCrossAttention):
                raise ValueError(f"{type(attn).__name__} cannot follow a source as it arrives")
            cross.append(attn.follow(source, like=like))
        caches = [layer.self_attn.new_cache(1, capacity, like=like) for layer in self.decoder_layers]
        return DecoderState(caches, cross)

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection [V, D] (the target embeddings when tied)."""
        return self.output.weight if self.output is not None else self.target_embed.weight

    def decode(self, tokens: Tensor, encoded: Encoded | None = None, *,
               state: DecoderState | None = None) -> Tensor:
        """Next-token logits.  tokens [N, T] -> [N, T, V]

        Without ``state``, ``tokens`` is a whole (shifted) target and ``encoded`` its
        sources (training). With ``state``, ``tokens`` are the next tokens of each
        hypothesis after those already in the state, which is updated in place.
        """
        hidden = self.decode_hidden(tokens, encoded, state=state)  # [N, T, D]
        if self.projection is not None:
            return cast(Tensor, self.projection(hidden))
        return output_projection(hidden, self.output_weight)

    def decode_hidden(self, tokens: Tensor, encoded: Encoded | None = None, *,
                      state: DecoderState | None = None, record: Recorder | None = None) -> Tensor:
        """The decoder's last hidden states, before the output projection.  [N, T] -> [N, T, D]

        ``record`` (a whole target, no ``state``) collects each layer's attention weights."""
        extra: Tensor | None = None
        if record is not None:
            if state is not None or encoded is None:
                raise ValueError("attention weights are recorded for a whole target and its encoder output")
            record.memory, record.mask = encoded.memory, encoded.mask
        if state is None:
            if encoded is None:
                raise ValueError("decode() needs the encoder output or a decoding state")
            cross = [layer.cross_attn.prepare(encoded.memory, encoded.mask) for layer in self.decoder_layers]
            caches: list[KVCache | None] = [None] * len(self.decoder)
            offset = 0
            if self.cursor is not None:
                extra, _ = self.cursor.inputs(tokens, _units(encoded))
            if self.span_cursor is not None:
                extra = _plus(extra, self.span_cursor.inputs(tokens, _span_units(encoded)))
        else:
            cross, caches, offset = state.cross, list(state.caches), state.length
            state.length += tokens.size(1)
            if self.cursor is not None and state.cursor is not None:
                extra = self.cursor.step(tokens, state.cursor)
            if self.span_cursor is not None and state.span is not None:
                extra = _plus(extra, self.span_cursor.step(tokens, state.span))
        x = self._embed(self.target_embed, tokens, offset, extra)
        for layer, cross_state, cache in zip(self.decoder, cross, caches):
            x = layer(x, cross_state, cache=cache, record=record)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]"""
        return self.decode(tgt_in, self.encode(src))

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """The attention weights of every layer for sources and teacher-forced targets, as
        in the model's current mode (``eval()`` for what decoding does).
        src [B, S], tgt_in [B, T] (BOS first) -> :class:`AttentionMaps`"""
        record = Recorder()
        self.decode_hidden(tgt_in, self.encode(src, record=record), record=record)
        return record.maps()

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> the decoder's last hidden states [B, T, D]"""
        return self.decode_hidden(tgt_in, self.encode(src))


def _units(encoded: Encoded) -> Tensor:
    if encoded.units is None:
        raise ValueError("a source-cursor model needs Encoded.units (from encode())")
    return encoded.units


def _span_units(encoded: Encoded) -> Tensor:
    if encoded.span_units is None:
        raise ValueError("a span-cursor model needs Encoded.span_units (from encode())")
    return encoded.span_units


def _plus(extra: Tensor | None, more: Tensor) -> Tensor:
    return more if extra is None else extra + more


def build_model(config: ModelConfig, codec: Codec[Any, Any, Any]) -> Transformer:
    """The model for a config and its task's codec: embeddings shared when the
    vocabularies are, the source walk taken when the codec declares one, the source
    vectors when the config asks for them and the codec offers them."""
    vocabs = codec.vocabularies
    walk = codec.source_walk() if isinstance(codec, SourceWalking) else None
    vectors = codec.source_vectors() if config.source_vectors and isinstance(codec, SourceVectoring) else None
    return Transformer(config, source_vocab_size=len(vocabs.source), target_vocab_size=len(vocabs.target),
                       shared_vocab=vocabs.shared, walk=walk, vectors=vectors)
