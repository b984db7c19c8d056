"""Streaming with an encoder that reads the whole source: the prefix read so far is
encoded again at each read (test-time wait-k, Ma et al. 2019).

A bidirectional encoder (every pretrained one) gives a source position another state
once more source has arrived, so a state computed against the prefix read earlier is
stale. Under a wait-k lag k, the step that decides target token t (BOS at step 0, so t
tokens written before it) sees the first min(t + k, |x| + 1) source positions, the end
symbol being the last: exactly what a causal model's wait-k mask lets it see. When that
prefix has grown since the last step, the step encodes it whole, prepares the
encoder-decoder keys and values anew, and runs the decoder over BOS and every token
written in one teacher-forced pass (which also rebuilds its self-attention caches);
while it has not grown (the whole source read), the step feeds the last token to that
state, as offline greedy decoding does. Tokens written are never revised. Without a lag
(``decode.wait_k`` and ``model.wait_k`` 0) the whole source is read first, and the
output is that of offline greedy decoding.

Each step's next-token distribution is therefore that of the model decoding offline
with the prefix as its whole source, teacher-forced with the tokens written, under the
same lag mask (which hides nothing from the step itself): :class:`StreamDecoder
<seqtrans.streaming.decoder.StreamDecoder>` takes its argmax, with the length bound and
delays of any streaming. Once the whole source has been read, every later token is the
one offline greedy decoding would write after the tokens written so far.

A sentence of n tokens costs about n encoder passes over prefixes up to n long and as
many decoder passes over targets up to its output's length: O(n^2) per sentence where a
causal encoder's streaming is O(n).

Shapes: S' source positions seen, T' target tokens fed, D model, V vocabulary.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.attention import reading
from seqtrans.config import DecodeConfig
from seqtrans.model.transformer import DecoderState, Transformer


class ReadSource(Protocol):
    """The source as the streaming decoder reads it, one position at a time."""

    ids: list[int]  # the positions read, the end symbol included once read
    complete: bool  # the end symbol has been read

    def read(self) -> bool:
        """Read one more position; False once complete; raises when the next has not arrived."""
        ...


class PrefixReencoding:
    """The steps of a model whose encoder reads the whole source (see the module docstring)."""

    def __init__(self, model: Transformer, config: DecodeConfig, source: ReadSource) -> None:
        self.model = model
        self.config = config
        self.source = source
        # the lag reading(config) gives scaled-dot attention: decode.wait_k, else the model's own
        self.lag = config.wait_k or model.config.wait_k
        self.encoded = 0  # source positions in the current state
        self.state: DecoderState | None = None

    def positions(self, step: int) -> int:
        """Read the source as far as ``step`` sees, and that many positions; raises
        (nothing changed but what was read) when it has not arrived."""
        source = self.source
        wanted = step + self.lag if self.lag else None
        while not source.complete and (wanted is None or len(source.ids) < wanted):
            source.read()
        return len(source.ids) if wanted is None else min(wanted, len(source.ids))

    def log_probs(self, tokens: list[int]) -> Tensor:
        """The next token's log-probabilities after ``tokens`` (BOS and the output so far),
        with the source prefix that step sees as the source.  -> [1, V]"""
        model, device = self.model, self.model.device
        seen = self.positions(len(tokens) - 1)
        if self.state is None or seen != self.encoded:
            src = torch.tensor([self.source.ids[:seen]], device=device)  # [1, S']
            with reading(self.config):  # the lag mask prepared as offline decoding prepares it
                self.state = model.start(model.encode(src))
            self.encoded = seen
        fed = torch.tensor([tokens[self.state.length:]], device=device)  # [1, T']: all, or the last
        logits = model.decode(fed, state=self.state)[:, -1]  # [1, V]
        return F.log_softmax(logits.float(), dim=-1)
