"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), section 3.

``encode()`` and ``decode()`` are separate steps: search encodes once, then calls
``decode()`` one token at a time with a :class:`DecoderState` holding the
self-attention key/value caches and the encoder-decoder keys/values computed once
per source. A task adds model-side parts through the extension seam
(:mod:`seqtrans.model.extension`): they are called at the source embeddings and at the
decoder inputs, and their decoding state travels in the :class:`DecoderState`.

The layers are in :mod:`seqtrans.model.layers` and what encoding and decoding keep in
:mod:`seqtrans.model.state`; their names are importable from here too, as they were when
this module held them.

Variants that models trained elsewhere use are model options, each off by default:
RMSNorm (:mod:`seqtrans.model.norms`), relative position biases
(:mod:`seqtrans.model.relative`), gated feed-forward layers, no biases, unscaled
attention, heads of another width (:mod:`seqtrans.attention.scaled_dot`) and a scaled
output; docs/configuration.md says where each comes from.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source length,
T target length (this call), D d_model, V vocabulary.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from seqtrans.attention import AttentionMaps, DecodingState, KVCache, Recorder
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import PAD
from seqtrans.linear.fp32 import biased, output_projection
from seqtrans.model.dropout import Dropout
from seqtrans.model.extension import Feature, ModelExtension, check_supported
from seqtrans.model.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    Positions,
    Residual,
    relative_bias,
    token_embeddings,
)
from seqtrans.model.masks import padding_mask
from seqtrans.model.norms import make_norm
from seqtrans.model.state import DecoderState, Encoded, EncoderState
from seqtrans.tasks.protocol import Codec, ModelExtending

__all__ = ["DecoderLayer", "DecoderState", "Encoded", "EncoderLayer", "EncoderState", "FeedForward",
           "Positions", "Residual", "Transformer", "attention_maps", "build_model"]


def _output_parts(model: Transformer, c: ModelConfig, target_vocab_size: int) -> None:
    """The output projection's own parts of ``model``: its weight where it is not the tied
    embedding, a bias (trained, or a buffer never trained) and a scale."""
    if not c.tie_output:
        model.output = nn.Linear(c.d_model, target_vocab_size, bias=False)
        nn.init.normal_(model.output.weight, std=c.d_model**-0.5)
    if c.output_bias and c.fixed_output_bias:  # a buffer: saved and moved with the model, never trained
        model.register_buffer("output_bias", torch.zeros(target_vocab_size))  # [V]
    else:
        model.output_bias = nn.Parameter(torch.zeros(target_vocab_size)) if c.output_bias else None  # [V]
    model.output_scale = c.d_model**-0.5 if c.scale_output else None


class StepRunner(Protocol):
    """Runs a decoder's layers, final norm and output scale for one new position
    (:meth:`Transformer.decode_hidden` with a state), or has ``layers()`` run them."""

    def run(self, x: Tensor, state: DecoderState, offset: int, bias: Tensor | None,
            layers: Callable[[], Tensor]) -> Tensor: ...


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    ``forward(src [B, S], tgt_in [B, T]) -> logits [B, T, V]`` for training;
    ``encode`` / ``start`` / ``decode`` for search; ``start_encoding`` / ``encode_next``
    for sources that arrive while decoding (a causal encoder), whose decoding state
    :mod:`seqtrans.streaming.decoder` makes.

    A task's model-side parts are attached with :meth:`extend` (``build_model`` does so
    for a codec with the ``ModelExtending`` ability). A wait-k lag other than the model's
    own (``decode.wait_k``, or a multi-k training batch's) is set around a call with
    :func:`seqtrans.attention.waiting`.
    """

    output_bias: Tensor | None  # [V] (see _output_parts)
    output_scale: float | None
    #: a decoding copy's way of running the decoder's layers for a step in one call, the
    #: same bits as the layers' own (seqtrans.linear.native_step); never trained or saved
    native_step: StepRunner | None = None

    def __init__(self, config: ModelConfig, *, source_vocab_size: int, target_vocab_size: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        c = self.config = config
        self.scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        self.target_embed = token_embeddings(target_vocab_size, c.d_model)
        shared = shared_vocab and c.share_embeddings
        self.source_embed = self.target_embed if shared else token_embeddings(source_vocab_size, c.d_model)
        def positions() -> Positions | None:
            if c.positions == "relative":  # no encodings added: a bias in self-attention instead
                return None
            return Positions(c.positions, c.d_model, c.max_positions, layout=c.sinusoid_layout,
                             frequencies=c.sinusoid_frequencies, offset=c.position_offset)

        def norm() -> nn.Module:
            return make_norm(c.norm_kind, c.d_model, eps=c.norm_eps)

        # one table for both stacks, or the decoder its own (model.shared_positions)
        self.positions = positions()
        self.decoder_positions = None if c.shared_positions else positions()
        self.dropout = Dropout(c.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        pre = c.norm == "pre"
        # pre-norm leaves the stacks' outputs unnormalised: one final LayerNorm each
        self.encoder_norm = norm() if pre else nn.Identity()
        self.decoder_norm = norm() if pre else nn.Identity()
        self.output: nn.Linear | None = None
        _output_parts(self, c, target_vocab_size)
        # optional parts made only when asked for, so that a model without them initialises as before
        self.embedding_norm = norm() if c.embedding_norm else None
        self.decoder_embedding_norm = norm() if c.embedding_norm and not c.shared_positions else None
        # model.positions=relative: each stack's bias table, computed once a call for all its layers
        self.relative_bias = relative_bias(c, bidirectional=True)
        self.decoder_relative_bias = relative_bias(c, bidirectional=False)
        # the task's model-side parts (seqtrans.model.extension), in the order they are applied;
        # registered last, so that their parameters come after the Transformer's own
        self.extensions = nn.ModuleDict()
        # a decoding-only replacement of ``x @ output_weight.T`` (seqtrans.linear.quantize); never trained
        self.projection: nn.Module | None = None

    @property
    def projection_adds_bias(self) -> bool:
        """Whether ``projection`` adds ``output_bias`` itself, as its product's last step: a
        projection is made without a bias and given the output bias only for that
        (seqtrans.linear.quantize)."""
        return getattr(self.projection, "bias", None) is not None

    def extend(self, extensions: Mapping[str, ModelExtension]) -> None:
        """Attach a task's model extensions, applied in the given order after any already attached."""
        for name, extension in extensions.items():
            if not isinstance(extension, ModelExtension):
                raise TypeError(f"model extension '{name}' is a {type(extension).__name__}, "
                                "not a seqtrans.model.extension.ModelExtension")
            if not name.isidentifier() or name in self.extensions:
                raise ValueError(f"model extension name '{name}' is not an identifier or is taken")
            self.extensions[name] = extension

    def named_extensions(self) -> list[tuple[str, ModelExtension]]:
        """The attached extensions, by name, in the order they are applied."""
        return [(name, cast(ModelExtension, ext)) for name, ext in self.extensions.items()]

    def check_supported(self, feature: Feature) -> None:
        """Raise :class:`~seqtrans.model.extension.ExtensionError` when an extension of this
        model cannot take part in ``feature`` (export, quantize, stream, ensemble)."""
        check_supported(self.named_extensions(), feature)

    @property
    def encoder_layers(self) -> list[EncoderLayer]:
        return cast(list[EncoderLayer], list(self.encoder))

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.decoder))

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a shared embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    def _embed(self, embed: nn.Embedding, tokens: Tensor, offset: int, extra: Tensor | None = None, *,
               source: bool) -> Tensor:
        """Token embeddings, scaled, plus positions (and a task's ``extra``), normalised
        where the model says so: the encoder's (``source``) or the decoder's.  [N, T] -> [N, T, D]"""
        positions, norm = self.positions, self.embedding_norm
        if not source:  # the decoder's own table and norm, where it has them (model.shared_positions)
            if self.decoder_positions is not None:
                positions = self.decoder_positions
            if self.decoder_embedding_norm is not None:
                norm = self.decoder_embedding_norm
        x = embed(tokens) * self.scale  # [N, T, D]
        if positions is not None:
            x = x + positions(tokens.size(1), offset=offset, device=tokens.device).to(x.dtype)
        if extra is not None:
            x = x + extra
        if norm is not None:
            x = norm(x)
        return self.dropout(x)

    def encode(self, src: Tensor, *, record: Recorder | None = None) -> Encoded:
        """src [B, S] (padded with PAD) -> memory [B, S, D]; ``record`` collects the
        self-attention weights of each layer."""
        mask = padding_mask(src, PAD)  # [B, S]
        extra: Tensor | None = None
        for _, extension in self.named_extensions():
            extra = _plus(extra, extension.encoder_input(src))
        x = self._embed(self.source_embed, src, 0, extra, source=True)
        bias = None if self.relative_bias is None else self.relative_bias(src.size(1), src.size(1))
        for layer in self.encoder:
            x = layer(x, mask, record=record, position_bias=bias)
        memory = self.encoder_norm(x)
        context = {name: extension.source_context(src, memory) for name, extension in self.named_extensions()}
        return Encoded(memory, mask, context)

    def start_encoding(self, *, rows: int = 1, capacity: int = 64) -> EncoderState:
        """An empty incremental encoding of ``rows`` sources (``model.causal_encoder``)."""
        if not self.config.causal_encoder:
            raise ValueError("incremental encoding needs a causal encoder (model.causal_encoder)")
        self.check_supported("stream")
        like = self.float_like()
        return EncoderState([layer.self_attn.new_cache(rows, capacity, like=like)
                             for layer in self.encoder_layers])

    def encode_next(self, tokens: Tensor, state: EncoderState) -> Tensor:
        """The encoder states of the next source tokens, after those in ``state``, which is
        updated. A causal encoder gives every position the state it has in ``encode()``
        of the whole source.  tokens [B, S'] (no padding) -> [B, S', D]"""
        # start_encoding has checked that every extension can stream: not again per token
        x = self._embed(self.source_embed, tokens, state.length, source=True)
        new, seen = tokens.size(1), state.length + tokens.size(1)
        bias = None if self.relative_bias is None else self.relative_bias(new, seen, offset=state.length)
        for layer, cache in zip(self.encoder, state.caches):
            x = layer(x, None, cache=cache, position_bias=bias)
        state.length += tokens.size(1)
        return self.encoder_norm(x)

    def start(self, encoded: Encoded, *, beam: int = 1, capacity: int = 64) -> DecoderState:
        """A fresh decoding state for ``beam`` hypotheses per source, room for ``capacity`` tokens."""
        rows = encoded.memory.size(0) * beam
        extensions = {}
        for name, extension in self.named_extensions():
            state = extension.start(encoded.context.get(name), rows)
            if state is not None:
                extensions[name] = state
        caches = [layer.self_attn.new_cache(rows, capacity, like=encoded.memory)
                  for layer in self.decoder_layers]
        for cache in caches:
            if isinstance(cache, KVCache):
                cache.beam = beam  # the native attention takes a sentence's hypotheses together
        return DecoderState(
            caches=caches,
            cross=[layer.cross_attn.prepare(encoded.memory, encoded.mask) for layer in self.decoder_layers],
            extensions=extensions,
        )

    @property
    def device(self) -> torch.device:
        return self.float_like().device

    def float_like(self) -> Tensor:
        """A float tensor of the model's, whose dtype and device new decoding states take:
        its first floating-point parameter, or buffer where a decoding copy keeps its
        weights in integers and no float parameter (seqtrans.linear.quantize)."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            if tensor.is_floating_point():
                return tensor
        raise ValueError("the model holds no floating-point tensor")

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
        return _logits(self, self.decode_hidden(tokens, encoded, state=state))

    def decode_rows(self, tokens: Tensor, rows: Tensor, *, state: DecoderState) -> Tensor:
        """:meth:`decode` of every hypothesis, the output product of ``rows`` [R] alone.  -> [R, T, V]"""
        return _logits(self, self.decode_hidden(tokens, state=state)[rows])

    def advance(self, tokens: Tensor, *, state: DecoderState) -> None:
        """:meth:`decode` without the output product: ``tokens`` given, not chosen."""
        self.decode_hidden(tokens, state=state)

    def decode_hidden(self, tokens: Tensor, encoded: Encoded | None = None, *,
                      state: DecoderState | None = None, record: Recorder | None = None) -> Tensor:
        """The decoder's last hidden states, as the output projection reads them.  [N, T] -> [N, T, D]

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
            for name, extension in self.named_extensions():
                extra = _plus(extra, extension.decoder_input(tokens, encoded.context.get(name)))
        else:
            cross, caches, offset = state.cross, list(state.caches), state.length
            state.length += tokens.size(1)
            for name, extension in self.named_extensions():
                extra = _plus(extra, extension.step(tokens, state.extensions.get(name)))
        x = self._embed(self.target_embed, tokens, offset, extra, source=False)
        bias = None
        if self.decoder_relative_bias is not None:
            bias = self.decoder_relative_bias(tokens.size(1), offset + tokens.size(1), offset=offset)
        layers = partial(_decoder_stack, self, x, cross, caches, record, bias)
        if state is not None and record is None and self.native_step is not None:
            return self.native_step.run(x, state, offset, bias, layers)
        return layers()

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]"""
        return self.decode(tgt_in, self.encode(src))

    def hidden(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> the decoder's last hidden states [B, T, D]"""
        return self.decode_hidden(tgt_in, self.encode(src))


@torch.no_grad()
def attention_maps(model: Transformer, src: Tensor, tgt_in: Tensor) -> AttentionMaps:
    """The attention weights of every layer of ``model`` for sources and teacher-forced
    targets, as in the model's current mode (``eval()`` for what decoding does).
    src [B, S], tgt_in [B, T] (BOS first) -> :class:`AttentionMaps`"""
    record = Recorder()
    model.decode_hidden(tgt_in, model.encode(src, record=record), record=record)
    return record.maps()


def _decoder_stack(model: Transformer, x: Tensor, cross: list[DecodingState], caches: list[KVCache | None],
                   record: Recorder | None, bias: Tensor | None) -> Tensor:
    """The decoder's layers, final norm and output scale over embedded targets.  [N, T, D] -> [N, T, D]"""
    for layer, cross_state, cache in zip(model.decoder, cross, caches):
        x = layer(x, cross_state, cache=cache, record=record, position_bias=bias)
    x = model.decoder_norm(x)
    # model.scale_output: what the projection reads is scaled, in training and decoding alike
    return x if model.output_scale is None else x * model.output_scale


def _plus(extra: Tensor | None, more: Tensor | None) -> Tensor | None:
    if more is None:
        return extra
    return more if extra is None else extra + more


def build_model(config: ModelConfig, codec: Codec[Any, Any, Any]) -> Transformer:
    """The model for a config and its task's codec: embeddings shared when the
    vocabularies are, and the codec's model extensions attached when it has any."""
    vocabs = codec.vocabularies
    model = Transformer(config, source_vocab_size=len(vocabs.source), target_vocab_size=len(vocabs.target),
                        shared_vocab=vocabs.shared)
    if isinstance(codec, ModelExtending):
        # made after the model's own parameters, so a seed initialises them as before
        model.extend(codec.model_extensions(config))
    return model


def _logits(model: Transformer, hidden: Tensor) -> Tensor:
    """The output product (and bias) of decoder states: the same bits for a row in any batch
    on the CPU's decoding copies.  [N, T, D] -> [N, T, V]"""
    if model.projection is not None:
        logits = cast(Tensor, model.projection(hidden))
    else:
        logits = output_projection(hidden, model.output_weight)
    if model.output_bias is None or model.projection_adds_bias:
        return logits
    return biased(logits, model.output_bias)
