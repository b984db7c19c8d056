"""Streaming decoding: the same output as greedy decoding of the whole source, written
while the source is still arriving, with delays and latency metrics as documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from conftest import tiny_model
from seqtrans.attention.monotonic import MonotonicAttention
from seqtrans.config import DecodeConfig
from seqtrans.data import pad_batch
from seqtrans.decoding import greedy_search
from seqtrans.decoding.generate import max_output_length
from seqtrans.decoding.streaming import (
    average_lagging,
    average_proportion,
    check_streamable,
    stream_greedy,
)
from seqtrans.errors import UsageError
from seqtrans.model import Transformer
from seqtrans.vocab import EOS

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5]]
CONFIG = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)


def streaming_model(seed: int, *, g: float, r: float) -> Transformer:
    model = tiny_model(seed=seed, cross_attention="monotonic", causal_encoder=True, monotonic_noise=0.0)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, MonotonicAttention)
        attn.g.data.fill_(g)
        attn.r.data.fill_(r)
    return model


class Counting:
    """A source that records how many tokens were taken from it."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.taken = 0

    def __iter__(self) -> Iterator[int]:
        for token in self.tokens:
            self.taken += 1
            yield token


# (seed 0 happens to read each source to its end before writing: the same output all the same)
@pytest.mark.parametrize("seed, g, r, writes_early", [(0, 2.0, 0.0, False), (1, 3.0, 0.5, True),
                                                      (2, 2.0, -0.5, True), (3, 1.0, 3.0, True)])
def test_streaming_writes_what_greedy_decoding_of_the_whole_source_writes(seed: int, g: float, r: float,
                                                                          writes_early: bool) -> None:
    model = streaming_model(seed, g=g, r=r)
    src = pad_batch([s + [EOS] for s in SOURCES])
    max_len = torch.tensor([max_output_length(len(s), CONFIG) for s in SOURCES])
    offline = greedy_search(model.eval(), src, max_len=max_len)
    early = 0
    for source, hyps in zip(SOURCES, offline):
        emitted = list(stream_greedy(model, source, CONFIG))
        assert [e.token for e in emitted] == (hyps[0].tokens if hyps else [])
        delays = [e.delay for e in emitted]
        assert delays == sorted(delays) and all(1 <= d <= len(source) for d in delays)
        early += sum(d < len(source) for d in delays)
    assert (early > 0) == writes_early  # tokens written before the source had ended


def test_tokens_are_written_before_the_rest_of_the_source_is_read() -> None:
    model = streaming_model(0, g=0.1, r=20.0)  # every layer selects the first position it sees
    source = Counting([4, 5, 6, 7, 8, 9])
    stream = stream_greedy(model, source, DecodeConfig(beam=1, max_len_a=1.0, max_len_b=0))
    first = next(stream)
    assert first.delay == 1 and source.taken == 1
    rest = list(stream)
    # the output bound a * |x| + b makes each further token wait for one more source token
    assert [e.delay for e in rest] == list(range(2, 2 + len(rest)))
    assert source.taken == len(source.tokens)


def test_a_source_taken_only_as_far_as_the_tokens_written() -> None:
    model = streaming_model(1, g=3.0, r=0.5)
    source = Counting(SOURCES[2])
    for emission in stream_greedy(model, source, CONFIG):
        # positions looked at so far: at most the tokens read, plus the end of the input
        assert source.taken == emission.delay


def test_streaming_needs_monotonic_attention_and_a_causal_encoder() -> None:
    with pytest.raises(UsageError, match="model.cross_attention=monotonic .*model.causal_encoder=true"):
        check_streamable(tiny_model().config)
    with pytest.raises(UsageError, match="causal_encoder"):
        list(stream_greedy(tiny_model(cross_attention="monotonic"), [4, 5], CONFIG))


def test_latency_metrics_by_hand() -> None:
    # wait-2 on |x| = |y| = 4: delays 2 3 4 4; AL is k, AP is 13 / 16
    assert average_lagging([2, 3, 4, 4], 4) == pytest.approx(2.0)
    assert average_proportion([2, 3, 4, 4], 4) == pytest.approx(13 / 16)
    assert average_lagging([1, 2, 3, 4], 4) == pytest.approx(1.0)
    assert average_lagging([4, 4, 4, 4], 4) == pytest.approx(4.0)  # read everything first
    assert average_proportion([4, 4, 4, 4], 4) == pytest.approx(1.0)
    # |y| = 2 |x|: gamma = 2, so output i is due after (i - 1) / 2 source tokens
    assert average_lagging([1, 1, 2, 2], 2) == pytest.approx((1 + 0.5 + 1) / 3)
