"""Streaming decoding: the same output as greedy decoding of the whole source, written
while the source is still arriving, with delays as documented."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from test_policies import Counting

import seqtrans
from conftest import tiny_model
from seqtrans import tasks
from seqtrans.attention.monotonic import MonotonicAttention
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS, Vocab, Vocabularies
from seqtrans.decoding import greedy_search
from seqtrans.decoding.generate import max_output_length
from seqtrans.errors import DataError, UsageError
from seqtrans.inference import loading
from seqtrans.model.extension import ExtensionError
from seqtrans.model.transformer import Transformer
from seqtrans.streaming import predict as streaming
from seqtrans.streaming.decoder import check_streamable, following_state, stream_greedy
from seqtrans_copy import CopyCodec

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
    with pytest.raises(UsageError, match="model.cross_attention=monotonic, milk, mocha, mma_hard, mma_il, "
                                         "mma_chunk or scaled_dot .*"
                                         "model.causal_encoder=true"):
        check_streamable(tiny_model(cross_attention="memory"))
    with pytest.raises(UsageError, match="causal_encoder"):
        list(stream_greedy(tiny_model(cross_attention="monotonic"), [4, 5], CONFIG))


def test_a_model_extension_that_needs_whole_sources_refuses_to_stream() -> None:
    """The test extension gives no reason of its own for streaming: the engine's is used."""
    model = tiny_model(extension=True, cross_attention="monotonic", causal_encoder=True)
    with pytest.raises(ExtensionError, match="streaming .* extension 'counting' .* needs the whole source"):
        check_streamable(model)
    with pytest.raises(ExtensionError):
        list(stream_greedy(model, [4, 5], CONFIG))
    with pytest.raises(ExtensionError):
        model.start_encoding()
    with pytest.raises(ExtensionError):
        following_state(model, Counting([4, 5]))


def test_a_cross_attention_that_cannot_follow_a_stream_gets_no_following_state() -> None:
    model = tiny_model(cross_attention="dot", causal_encoder=True)
    with pytest.raises(ValueError, match="cannot follow a source as it arrives"):
        following_state(model, Counting([4, 5]))


# ------------------------------------------------------------------ the CLI's simultaneous mode


def loaded_copy(model: Transformer, *, max_len_b: int = 3) -> loading.Loaded:
    """The copy task (symbols 0..6, ids 4..10) around ``model``, as ``predict --stream`` loads it."""
    config = seqtrans.resolve_config("copy", overrides=["data.vocab_size=7", "decode.max_len_a=1.0",
                                                        f"decode.max_len_b={max_len_b}"])
    task = tasks.load("copy")(config.data)
    vocab = Vocab(str(s) for s in range(7))
    return loading.Loaded(config, task, CopyCodec(Vocabularies(vocab, vocab)), model, torch.device("cpu"))


class Arrivals:
    """Words of the input given one at a time, recording what was written after each."""

    def __init__(self, text: str) -> None:
        self.events = list(streaming.words_of([text]))
        self.pulled = 0
        self.log: list[tuple[int, str]] = []  # (events pulled, text written)

    def __iter__(self) -> Iterator[str | None]:
        for event in self.events:
            self.pulled += 1
            yield event

    def write(self, text: str) -> None:
        self.log.append((self.pulled, text))


def test_words_arrive_as_soon_as_the_whitespace_after_them_does() -> None:
    assert list(streaming.words_of(["1 2", "3  4", "\n", "\n5\t6\n7"])) == [
        "1", "23", "4", None, None, "5", "6", None, "7", None]
    assert list(streaming.words_of(["1 \n"])) == ["1", None]
    assert list(streaming.words_of([""])) == []


def test_the_cli_stream_writes_each_token_before_the_rest_of_its_input_arrives() -> None:
    model = streaming_model(0, g=0.1, r=20.0)  # every layer selects the first position it sees
    arrivals = Arrivals("4 5 6 1 2\n3 3\n")
    streaming.stream(loaded_copy(model, max_len_b=0), arrivals, arrivals.write)
    # the bound a * |x| + b with b = 0 makes each token wait for one more word, and no longer
    assert [pulled for pulled, _ in arrivals.log[:5]] == [1, 2, 3, 4, 5]
    assert "\t" not in "".join(text for _, text in arrivals.log[:5])
    lines = "".join(text for _, text in arrivals.log).split("\n")
    assert lines[-1] == "" and len(lines) == 3
    for line, words in zip(lines, ("4 5 6 1 2", "3 3")):
        output, delays = line.split("\t")
        ids = [int(w) + 4 for w in words.split()]
        expected = list(stream_greedy(model, ids, DecodeConfig(beam=1, max_len_a=1.0, max_len_b=0)))
        assert expected
        assert output.split() == [str(e.token - 4) for e in expected]
        assert [int(d) for d in delays.split()] == [e.delay for e in expected]


@pytest.mark.parametrize("seed, g, r", [(1, 3.0, 0.5), (2, 2.0, -0.5), (3, 1.0, 3.0)])
def test_the_cli_stream_writes_what_offline_greedy_decoding_writes(seed: int, g: float, r: float) -> None:
    model = streaming_model(seed, g=g, r=r)
    text = "".join(" ".join(str(i - 4) for i in s) + "\n" for s in SOURCES)
    arrivals = Arrivals(text)
    streaming.stream(loaded_copy(model), arrivals, arrivals.write)
    lines = "".join(t for _, t in arrivals.log).splitlines()
    src = pad_batch([s + [EOS] for s in SOURCES])
    max_len = torch.tensor([max_output_length(len(s), CONFIG) for s in SOURCES])
    offline = greedy_search(model.eval(), src, max_len=max_len)
    assert len(lines) == len(SOURCES)
    for line, hyps in zip(lines, offline):
        assert line.split("\t")[0].split() == [str(t - 4) for t in (hyps[0].tokens if hyps else [])]


def test_the_cli_stream_skips_the_rest_of_an_input_whose_output_has_ended(monkeypatch) -> None:  # noqa: ANN001
    model = streaming_model(0, g=0.1, r=20.0)
    decode = model.decode
    steps = 0

    def eos_at_the_second_step(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        nonlocal steps
        logits = decode(*args, **kwargs)
        steps += 1
        if steps % 2 == 0:  # each line: one token, then the end symbol
            logits[..., EOS] = 1e4
        return logits

    monkeypatch.setattr(model, "decode", eos_at_the_second_step)
    arrivals = Arrivals("4 5 6 1 2\n3 3 3\n6\n")
    streaming.stream(loaded_copy(model), arrivals, arrivals.write)
    lines = "".join(t for _, t in arrivals.log).splitlines()
    assert [line.split("\t")[1] for line in lines] == ["1", "1", "1"]
    fresh = streaming_model(0, g=0.1, r=20.0)
    first_tokens = [next(iter(stream_greedy(fresh, [int(w) + 4], CONFIG))).token - 4 for w in ("4", "3", "6")]
    assert [line.split("\t")[0] for line in lines] == [str(t) for t in first_tokens]
    # the first line's end was written before its second word was read
    assert arrivals.log[1] == (1, "\t1\n")


def test_the_cli_stream_refuses_a_tokenisation_that_changes_earlier_tokens() -> None:
    loaded = loaded_copy(streaming_model(0, g=0.1, r=20.0))

    class Reversing(CopyCodec):  # the copy task's codec, but its source tokens in reverse order
        def source_tokens(self, source: list[int]) -> list[str]:
            return super().source_tokens(source)[::-1]

    loaded = dataclasses.replace(loaded, codec=Reversing(loaded.codec.vocabularies))
    arrivals = Arrivals("4 5 6\n")
    with pytest.raises(DataError, match="<stdin>:1: .*cannot be streamed word by word"):
        streaming.stream(loaded, arrivals, arrivals.write)
