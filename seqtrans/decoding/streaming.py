"""Streaming (simultaneous) greedy decoding: target tokens are written while the source is
still arriving.

With a causal encoder (``model.causal_encoder``), a source position's encoder state never
changes once it has been computed; with hard monotonic encoder-decoder attention
(``model.cross_attention=monotonic``, Raffel et al. 2017), an output step looks at source
positions left to right and stops at the first it selects. Together they decide, at every
step, whether to read or to write: each decoder layer's attention reads source tokens
(running the encoder on each as it arrives) until it selects a position or the source
ends, and then the step writes its token. Reading more than that could not change the
token, so the output is exactly that of greedy decoding with the whole source at hand;
only the time at which each token is known changes.

The delay of an output token is the number of source tokens read when it was written
(the end of the input not counted, so a token written after the whole source has been
read has delay |x|). Average proportion (Cho and Esipova 2016) and average lagging (Ma
et al. 2019) summarise them.

Greedy only: a beam would have to wait for its hypotheses to agree before writing. The
maximum output length a * |x| + b holds as in offline decoding: while the source is
still arriving, a step that would exceed a * (tokens read) + b reads first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from seqtrans.attention.monotonic import MonotonicAttention, MonotonicState
from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.search import mask_log_probs
from seqtrans.errors import UsageError
from seqtrans.model import Encoded, EncoderLayer, Transformer
from seqtrans.vocab import BOS, EOS


@dataclass(frozen=True)
class Emission:
    """A target token and the number of source tokens read when it was written."""

    token: int
    delay: int


def check_streamable(config: ModelConfig) -> None:
    """Raise :class:`UsageError` unless models of ``config`` can decode a stream."""
    missing = []
    if config.cross_attention != "monotonic":
        missing.append(f"model.cross_attention=monotonic (this model has {config.cross_attention})")
    if not config.causal_encoder:
        missing.append("model.causal_encoder=true")
    if config.source_cursor:
        missing.append("model.source_cursor=false")
    if missing:
        raise UsageError("streaming needs a model trained with " + " and ".join(missing))


class _SourceStream:
    """Pulls source ids on demand, runs the causal encoder on each and extends every
    decoder layer's monotonic attention state with the new position."""

    def __init__(self, model: Transformer, tokens: Iterator[int], states: list[MonotonicState]) -> None:
        self.model = model
        self.tokens = tokens
        self.states = states
        like = model.target_embed.weight
        self.encoder = cast(list[EncoderLayer], list(model.encoder))
        self.caches = [layer.self_attn.new_cache(1, 64, like=like) for layer in self.encoder]
        self.positions = 0  # source positions encoded, the end symbol included
        self.read_tokens = 0  # source tokens read, the end symbol excluded
        self.complete = False
        for state in states:
            state.source, state.complete = self, False

    def read(self) -> bool:
        if self.complete:
            return False
        token = next(self.tokens, None)
        ended = token is None
        ids = torch.tensor([[EOS if token is None else token]], device=self.model.target_embed.weight.device)
        model = self.model
        x = model._embed(model.source_embed, ids, self.positions)  # [1, 1, D]
        for layer, cache in zip(self.encoder, self.caches):
            x = layer(x, None, cache=cache)
        memory = model.encoder_norm(x)  # [1, 1, D]
        for decoder_layer, state in zip(model.decoder_layers, self.states):
            attn = decoder_layer.cross_attn
            assert isinstance(attn, MonotonicAttention)
            attn.extend(state, memory)
        self.positions += 1
        if ended:
            self.complete = True
            for state in self.states:
                state.complete = True
        else:
            self.read_tokens += 1
        return True


@torch.inference_mode()
def stream_greedy(model: Transformer, source: Iterable[int], config: DecodeConfig, *,
                  position_limit: int | None = None) -> Iterator[Emission]:
    """Greedy outputs of a source given token by token (ids, no end symbol), each yielded
    as soon as it is decided; ``source`` is read only as far as the decoder needs."""
    check_streamable(model.config)
    model.eval()
    device = model.target_embed.weight.device
    d_model = model.config.d_model
    empty = Encoded(torch.zeros(1, 0, d_model, device=device, dtype=model.target_embed.weight.dtype),
                    torch.zeros(1, 0, dtype=torch.bool, device=device))
    state = model.start(empty, beam=1, capacity=64)
    monotonic = [s for s in state.cross if isinstance(s, MonotonicState)]
    stream = _SourceStream(model, iter(source), monotonic)
    previous = BOS
    step = 0
    while True:
        logits = model.decode(torch.tensor([[previous]], device=device), state=state)[:, -1]  # [1, V]
        log_probs = F.log_softmax(logits.float(), dim=-1)
        while not stream.complete and step >= max_output_length(stream.read_tokens, config,
                                                                limit=position_limit):
            stream.read()  # the bound a * |x| + b is not known yet: read before writing
        limit = max_output_length(stream.read_tokens, config, limit=position_limit)
        log_probs = mask_log_probs(log_probs, force_eos=torch.tensor([step >= limit], device=device))
        token = int(log_probs.argmax(dim=-1))
        if token == EOS:
            return
        yield Emission(token, stream.read_tokens)
        previous = token
        step += 1


def average_proportion(delays: Sequence[int], source_length: int) -> float:
    """AP = sum_i g(i) / (|x| |y|) (Cho and Esipova 2016): 1 for reading everything first."""
    if not delays or source_length == 0:
        return float("nan")
    return sum(delays) / (source_length * len(delays))


def average_lagging(delays: Sequence[int], source_length: int) -> float:
    """AL = 1/tau sum_{i<=tau} (g(i) - (i - 1) / gamma) with gamma = |y| / |x| and tau the
    first output written after the whole source was read (Ma et al. 2019): k for wait-k."""
    if not delays or source_length == 0:
        return float("nan")
    gamma = len(delays) / source_length
    tau = next((i + 1 for i, g in enumerate(delays) if g >= source_length), len(delays))
    return sum(delays[i] - i / gamma for i in range(tau)) / tau
