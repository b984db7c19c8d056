"""Streaming (simultaneous) greedy decoding: target tokens are written while the source is
still arriving.

With a causal encoder (``model.causal_encoder``), a source position's encoder state never
changes once it has been computed. Encoder-decoder attention then decides, at every
step, whether to read or to write; each decoder layer's attention reads source tokens
(running the encoder on each as it arrives) as far as it needs, and then the step writes
its token:

- hard monotonic attention (``model.cross_attention=monotonic``, Raffel et al. 2017)
  looks at source positions left to right and stops at the first it selects;
- its infinite lookback (``milk``, Arivazhagan et al. 2019) stops where the monotonic
  head selects and attends softly over everything read; its chunkwise form (``mocha``,
  Chiu and Raffel 2018) over the w positions read last;
- monotonic multihead attention (``mma_hard``, ``mma_il``, Ma et al. 2020; ``mma_chunk``) reads until
  every head of the layer has stopped, so a step writes once every head of every layer
  has;
- scaled-dot attention under wait-k (``model.wait_k``, ``decode.wait_k``; Ma et al.
  2019) reads k source tokens before the first write and one more before each next;
  without a lag it reads the whole source first.

Reading more than that could not change the token, so the output is exactly that of
greedy decoding with the whole source at hand (and the same lag); only the time at which
each token is known changes.

An encoder that reads the whole source (not causal: every pretrained encoder) gives a
position another state once more source has arrived. Such a model streams under wait-k
with scaled-dot attention by re-encoding the source read so far
(:mod:`seqtrans.streaming.reencoding`): each step's token is the one the model decoding
offline would pick with that prefix as its source. Learned policies decide from states
that would change under them, so they need a causal encoder.

:class:`StreamDecoder` is the one implementation, push-style and without a thread: the
caller pushes source ids as they arrive (:meth:`~StreamDecoder.push`) and says when the
source ends (:meth:`~StreamDecoder.finish`); each call decodes as far as the source at
hand allows and returns the tokens it decided. The model still reads the pushed source
only as far as its attention asks, so a token's delay does not depend on how early the
source was pushed. A step whose attention asks for a source token that has not arrived
is undone (every field of the decoding state is put back; see :func:`_snapshot`) and
run again once more source is pushed. :func:`stream_greedy` is the same decoding for a
source given as an iterator, pulled only as far as the decoder needs.

The delay of an output token is the number of source tokens read when it was written
(the end of the input not counted, so a token written after the whole source has been
read has delay |x|). The end of the output has a delay too (``end_delay``): the tokens
read when the end was decided, which a reader of text needs to know that the last word
is complete. :mod:`seqtrans.streaming.latency` summarises delays (AP, AL, LAAL, DAL).

Greedy only: a beam would have to wait for its hypotheses to agree before writing. The
maximum output length a * |x| + b holds as in offline decoding: while the source is
still arriving, a step that would exceed a * (tokens read) + b reads first. Tokens every
output starts with (a target language's code) are forced, as offline decoding forces a
prefix, and are not emitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.attention import DecodingState, SourceStream, StreamingCrossAttention, reading
from seqtrans.config import DecodeConfig
from seqtrans.config.model import LEARNED_POLICIES
from seqtrans.data.vocab import BOS, EOS
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.search import mask_log_probs
from seqtrans.errors import UsageError
from seqtrans.model.transformer import DecoderState, Transformer
from seqtrans.streaming.reencoding import PrefixReencoding

#: Encoder-decoder attention that decides when to read: hard monotonic and its lookback
#: (MILk, and over a chunk, MoChA), monotonic multihead attention (hard and infinite lookback), and scaled-dot
#: attention under wait-k (or reading the whole source first).
STREAMING = (*LEARNED_POLICIES, "scaled_dot")
#: Of those, the learned policies: they need a causal encoder.
LEARNED = LEARNED_POLICIES


@dataclass(frozen=True)
class Emission:
    """A target token and the number of source tokens read when it was written."""

    token: int
    delay: int


def check_streamable(model: Transformer) -> None:
    """Raise :class:`UsageError` unless ``model`` can decode a stream: its settings, then
    its task's model extensions (:class:`~seqtrans.model.extension.ExtensionError`)."""
    config = model.config
    if config.cross_attention not in STREAMING:
        raise UsageError(f"streaming needs a model trained with model.cross_attention={', '.join(LEARNED)} "
                         f"or {STREAMING[-1]} (this model has {config.cross_attention}); the learned "
                         "policies also need model.causal_encoder=true")
    if config.cross_attention in LEARNED and not config.causal_encoder:
        raise UsageError(f"streaming with model.cross_attention={config.cross_attention} (a learned read "
                         "policy) needs a model trained with model.causal_encoder=true; a model whose "
                         "encoder reads the whole source streams with model.cross_attention=scaled_dot "
                         "instead, under wait-k (decode.wait_k=K), re-encoding the source read so far")
    model.check_supported("stream")


class _NeedSource(Exception):
    """The decoder asked for a source token that has not been pushed yet."""


class _SourceStream:
    """Pushed source ids, read one position at a time as the decoder asks for them. A
    causal encoder encodes each position as it is read, once; the encoder states are
    kept for every decoder layer to take (``states_from``)."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.pending: deque[int] = deque()  # pushed, not read yet
        self.ended = False  # the caller said the source ends after the pending ids
        self.ids: list[int] = []  # the positions read, the end symbol included once read
        self.encoding = model.start_encoding() if model.config.causal_encoder else None
        self.memory: list[Tensor] = []  # [1, 1, D] per position encoded, the end symbol included
        self.read_tokens = 0  # source tokens read, the end symbol excluded
        self.complete = False  # the end symbol has been read

    def read(self) -> bool:
        """Read one more source position (the end symbol once the source ends); False
        when the source has already ended; :class:`_NeedSource` when the next id has not
        been pushed."""
        if self.complete:
            return False
        if self.pending:
            token: int | None = self.pending.popleft()
        elif self.ended:
            token = None
        else:
            raise _NeedSource
        self.ids.append(EOS if token is None else token)
        if self.encoding is not None:
            ids = torch.tensor([self.ids[-1:]], device=self.model.device)  # [1, 1]
            self.memory.append(self.model.encode_next(ids, self.encoding))
        if token is None:
            self.complete = True
        else:
            self.read_tokens += 1
        return True

    def states_from(self, position: int) -> Tensor | None:
        if position >= len(self.memory) and not self.read():
            return None
        return torch.cat(self.memory[position:], dim=1)  # [1, S', D]


def _snapshot(state: DecoderState) -> list[tuple[object, dict[str, Any]]]:
    """The fields of every object of a decoding state, to undo a step that ran out of
    source. Attention states change by replacing fields (new tensors), never by writing
    into the tensors they hold, and a self-attention cache writes only past its
    ``length``: putting the fields back undoes the step."""
    objects: list[object] = [state, *state.caches, *state.cross, *state.extensions.values()]
    return [(obj, dict(vars(obj))) for obj in objects]


def _restore(saved: list[tuple[object, dict[str, Any]]]) -> None:
    for obj, fields in saved:
        vars(obj).clear()
        vars(obj).update(fields)


def following_state(model: Transformer, source: SourceStream, *, capacity: int = 64) -> DecoderState:
    """A decoding state of ``model`` for one hypothesis over a source that arrives while
    decoding: each layer's encoder-decoder attention pulls encoder states from ``source``
    as it needs them. Needs a cross-attention that can follow a stream (monotonic, or
    scaled-dot under wait-k)."""
    model.check_supported("stream")
    like = model.float_like()
    cross: list[DecodingState] = []
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        if not isinstance(attn, StreamingCrossAttention):
            raise ValueError(f"{type(attn).__name__} cannot follow a source as it arrives")
        cross.append(attn.follow(source, like=like))
    caches = [layer.self_attn.new_cache(1, capacity, like=like) for layer in model.decoder_layers]
    return DecoderState(caches, cross)


class _Following:
    """The steps of a causal encoder's model: one decoding state, whose encoder-decoder
    attention reads the source as it needs (:func:`following_state`), fed each token once."""

    def __init__(self, model: Transformer, config: DecodeConfig, source: _SourceStream) -> None:
        self.model = model
        with reading(config):
            self.state = following_state(model, source)

    def log_probs(self, tokens: list[int]) -> Tensor:
        """The next token's log-probabilities after ``tokens`` (BOS and the output so far),
        feeding the state those it has not had; :class:`_NeedSource` leaves it as it was.
        -> [1, V]"""
        saved = _snapshot(self.state)
        try:
            for token in tokens[self.state.length:]:
                fed = torch.tensor([[token]], device=self.model.device)  # [1, 1]
                logits = self.model.decode(fed, state=self.state)[:, -1]  # [1, V]
        except _NeedSource:
            _restore(saved)
            raise
        return F.log_softmax(logits.float(), dim=-1)


class StreamDecoder:
    """Greedy streaming decoding of one source whose ids are pushed as they arrive.

    ``push(ids)`` and ``finish()`` return the :class:`Emission` s decided with the
    source at hand; ``done`` is true once the output has ended, with ``end_delay`` the
    source tokens read when its end was decided (``finish()`` always ends it). Ids
    pushed after the output has ended are not read. ``prefix``: target ids every output
    starts with, forced and not emitted.
    """

    def __init__(self, model: Transformer, config: DecodeConfig, *, position_limit: int | None = None,
                 prefix: Sequence[int] = ()) -> None:
        check_streamable(model)
        model.eval()
        self.model = model
        self.config = config
        self.position_limit = position_limit
        self._source = _SourceStream(model)
        # a causal encoder's states never change: one state follows the source; any other
        # encoder's change as the source grows, so the prefix read is encoded again
        self._steps: _Following | PrefixReencoding = (
            _Following(model, config, self._source) if model.config.causal_encoder
            else PrefixReencoding(model, config, self._source))
        self._tokens = [BOS, *prefix]  # BOS, the forced prefix, the tokens written
        self._log_probs: Tensor | None = None  # the current step's, once decoded
        self.done = False
        self.end_delay: int | None = None

    @property
    def read_tokens(self) -> int:
        """Source tokens read so far (the end symbol not counted)."""
        return self._source.read_tokens

    def push(self, ids: Iterable[int]) -> list[Emission]:
        """Add source ids; the tokens now decided."""
        if self._source.ended:
            raise UsageError("a stream takes no more source after finish()")
        self._source.pending.extend(ids)
        return self._advance()

    def finish(self) -> list[Emission]:
        """End the source; the rest of the output."""
        if self._source.ended:
            raise UsageError("finish() was already called on this stream")
        self._source.ended = True
        emissions = self._advance()
        assert self.done, "a finished source decodes to the end"
        return emissions

    @torch.inference_mode()
    def _advance(self) -> list[Emission]:
        emissions: list[Emission] = []
        try:
            while not self.done:
                emission = self._next()
                if emission is not None:
                    emissions.append(emission)
        except _NeedSource:
            pass  # the rest waits for more source
        return emissions

    def _next(self) -> Emission | None:
        """Decide one token (None for the end), or raise :class:`_NeedSource`."""
        source, config = self._source, self.config
        if self._log_probs is None:
            self._log_probs = self._steps.log_probs(self._tokens)
        step = len(self._tokens) - 1
        while not source.complete and step >= max_output_length(source.read_tokens, config,
                                                                limit=self.position_limit):
            source.read()  # the bound a * |x| + b is not known yet: read before writing
        limit = max_output_length(source.read_tokens, config, limit=self.position_limit)
        log_probs = mask_log_probs(self._log_probs, force_eos=torch.tensor([step >= limit],
                                                                           device=self._log_probs.device))
        self._log_probs = None
        token = int(log_probs.argmax(dim=-1))
        if token == EOS:
            self.done = True
            self.end_delay = source.read_tokens
            return None
        self._tokens.append(token)
        return Emission(token, source.read_tokens)


def stream_greedy(model: Transformer, source: Iterable[int], config: DecodeConfig, *,
                  position_limit: int | None = None, prefix: Sequence[int] = ()) -> Iterator[Emission]:
    """Greedy outputs of a source given token by token (ids, no end symbol), each yielded
    as soon as it is decided; ``source`` is pulled only as far as the decoder needs (one
    id each time the decoder waits for more): :class:`StreamDecoder` over an iterator."""
    decoder = StreamDecoder(model, config, position_limit=position_limit, prefix=prefix)
    ids = iter(source)
    emissions: Sequence[Emission] = decoder.push(())
    while True:
        yield from emissions
        if decoder.done:
            return
        token = next(ids, None)
        emissions = decoder.finish() if token is None else decoder.push((token,))
