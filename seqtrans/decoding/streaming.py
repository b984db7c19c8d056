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
  head selects and attends softly over everything read;
- monotonic multihead attention (``mma_hard``, ``mma_il``, Ma et al. 2020) reads until
  every head of the layer has stopped, so a step writes once every head of every layer
  has;
- scaled-dot attention under wait-k (``model.wait_k``, ``decode.wait_k``; Ma et al.
  2019) reads k source tokens before the first write and one more before each next;
  without a lag it reads the whole source first.

Reading more than that could not change the token, so the output is exactly that of
greedy decoding with the whole source at hand (and the same lag); only the time at which
each token is known changes.

The delay of an output token is the number of source tokens read when it was written
(the end of the input not counted, so a token written after the whole source has been
read has delay |x|). :mod:`seqtrans.decoding.latency` summarises them (AP, AL, LAAL, DAL).

Greedy only: a beam would have to wait for its hypotheses to agree before writing. The
maximum output length a * |x| + b holds as in offline decoding: while the source is
still arriving, a step that would exceed a * (tokens read) + b reads first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.attention import waiting
from seqtrans.config import DecodeConfig
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.search import mask_log_probs
from seqtrans.errors import UsageError
from seqtrans.model import Transformer
from seqtrans.vocab import BOS, EOS

#: Encoder-decoder attention that decides when to read: hard monotonic and its lookback
#: (MILk), monotonic multihead attention (hard and infinite lookback), and scaled-dot
#: attention under wait-k (or reading the whole source first).
STREAMING = ("monotonic", "milk", "mma_hard", "mma_il", "scaled_dot")


@dataclass(frozen=True)
class Emission:
    """A target token and the number of source tokens read when it was written."""

    token: int
    delay: int


def check_streamable(model: Transformer) -> None:
    """Raise :class:`UsageError` unless ``model`` can decode a stream: its settings, then
    its task's model extensions (:class:`~seqtrans.extension.ExtensionError`)."""
    config = model.config
    missing = []
    if config.cross_attention not in STREAMING:
        missing.append(f"model.cross_attention={', '.join(STREAMING[:-1])} or {STREAMING[-1]} "
                       f"(this model has {config.cross_attention})")
    if not config.causal_encoder:
        missing.append("model.causal_encoder=true")
    if missing:
        raise UsageError("streaming needs a model trained with " + " and ".join(missing))
    model.check_supported("stream")


class _SourceStream:
    """Source ids pulled on demand and run through the causal encoder, one at a time; the
    encoder states are kept for every decoder layer to take (``states_from``)."""

    def __init__(self, model: Transformer, tokens: Iterator[int]) -> None:
        self.model = model
        self.tokens = tokens
        self.encoding = model.start_encoding()
        self.memory: list[Tensor] = []  # [1, 1, D] per position encoded, the end symbol included
        self.read_tokens = 0  # source tokens read, the end symbol excluded
        self.complete = False

    def read(self) -> bool:
        """Encode one more source position (the end symbol once the source ends); False
        when the source has already ended."""
        if self.complete:
            return False
        token = next(self.tokens, None)
        device = self.model.device
        ids = torch.tensor([[EOS if token is None else token]], device=device)  # [1, 1]
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


@torch.inference_mode()
def stream_greedy(model: Transformer, source: Iterable[int], config: DecodeConfig, *,
                  position_limit: int | None = None) -> Iterator[Emission]:
    """Greedy outputs of a source given token by token (ids, no end symbol), each yielded
    as soon as it is decided; ``source`` is read only as far as the decoder needs."""
    check_streamable(model)
    model.eval()
    device = model.device
    stream = _SourceStream(model, iter(source))
    with waiting(config.wait_k or None):
        state = model.start_streaming(stream)
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

