"""The push-style streaming session (``seqtrans.stream``) and the decoder under it: the
same tokens and delays however the source is pushed (word by word, in chunks, all at
once), equal to pulling it; a step that runs out of source is undone and run again; and
its refusals. The SimulEval agent's refusal of a model that cannot stream."""

from __future__ import annotations

import dataclasses
import random
from argparse import Namespace
from pathlib import Path

import pytest
from test_inference import copy_run
from test_streaming import Arrivals, loaded_copy, streaming_model

import seqtrans
from seqtrans.config import DecodeConfig
from seqtrans.errors import UsageError
from seqtrans.inference import loading
from seqtrans.model.transformer import Transformer
from seqtrans.streaming import decoder as streaming
from seqtrans.streaming import predict as streaming_input
from seqtrans.streaming.decoder import StreamDecoder, stream_greedy
from seqtrans.streaming.session import StreamSession
from seqtrans_copy import CopyCodec

SOURCES = [[0, 1, 2, 3, 4, 5], [6, 5, 4], [2, 2, 2, 2, 2, 2, 2, 2], [3]]


def _chunks(items: list[int], rng: random.Random) -> list[list[int]]:
    out: list[list[int]] = []
    while items:
        n = rng.randint(0, 3)  # empty pushes too
        out.append(items[:n])
        items = items[n:]
    return out


@pytest.mark.parametrize("seed, g, r", [(1, 3.0, 0.5), (3, 1.0, 3.0), (5, 2.0, -1.0)])
def test_pushing_in_any_chunks_decodes_as_pulling_the_source(seed: int, g: float, r: float,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model = streaming_model(seed, g=g, r=r)
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    undone = []
    restore = streaming._restore
    monkeypatch.setattr(streaming, "_restore", lambda saved: (undone.append(1), restore(saved)))
    rng = random.Random(seed)
    for source in SOURCES:
        ids = [t + 4 for t in source]
        pulled = list(stream_greedy(model, ids, decode))
        for _ in range(3):
            decoder = StreamDecoder(model, decode)
            pushed = [e for chunk in _chunks(ids, rng) for e in decoder.push(chunk)] + decoder.finish()
            assert pushed == pulled
            assert decoder.done and decoder.end_delay is not None and decoder.end_delay <= len(ids)
        whole = StreamDecoder(model, decode)
        assert whole.push(ids) + whole.finish() == pulled  # the model reads only what it asks for
    assert undone  # steps did run out of source, and were undone


def test_a_session_gives_the_same_words_and_delays_however_its_words_arrive() -> None:
    loaded = loaded_copy(streaming_model(3, g=1.0, r=3.0))
    words = "0 1 2 3 4 5 6 5".split()
    one = seqtrans.stream(loaded)
    updates = [one.push(w) for w in words] + [one.finish()]
    every = seqtrans.stream(loaded)
    every.push(" ".join(words))
    every.finish()
    assert one.tokens == every.tokens and one.output_words == every.output_words and one.done and every.done
    assert [w for u in updates for w in u.words] == one.output_words
    assert [t for u in updates for t in u.tokens] == one.tokens
    # the copy task's words are its tokens: a word is complete once the next is decided, or the end
    assert one.output.split() == [w.text for w in one.output_words] == [t.text for t in one.tokens]
    delays = [t.word_delay for t in one.tokens]
    assert one.end_delay is not None
    assert one.word_delays == [max(a, b) for a, b in zip(delays, delays[1:] + [len(words)])]


def test_a_session_refuses_words_after_its_end_and_bad_words() -> None:
    session = seqtrans.stream(loaded_copy(streaming_model(1, g=3.0, r=0.5)))
    with pytest.raises(UsageError, match="non-empty"):
        session.push(["1 2"])
    session.push("1 2")
    session.finish()
    with pytest.raises(UsageError, match="finish"):
        session.push("3")
    with pytest.raises(UsageError, match="already"):
        session.finish()
    decoder = StreamDecoder(streaming_model(1, g=3.0, r=0.5), DecodeConfig(beam=1))
    decoder.finish()
    with pytest.raises(UsageError, match="after finish"):
        decoder.push([5])


def test_a_session_needs_a_model_that_can_stream(tmp_path: Path) -> None:
    learned = ("model.cross_attention=monotonic",)  # a learned policy over an encoder that reads everything
    offline = seqtrans.load(copy_run(tmp_path / "offline", seed=1, model=learned), device="cpu")
    with pytest.raises(UsageError, match="model.causal_encoder=true.*wait-k"):
        StreamSession(offline)


def test_the_simuleval_agent_exits_with_the_settings_a_run_needs(tmp_path: Path) -> None:
    pytest.importorskip("simuleval")
    from seqtrans.streaming.simuleval import Agent

    run = copy_run(tmp_path / "offline", seed=1, model=("model.cross_attention=monotonic",))
    args = Namespace(seqtrans_run=str(run), seqtrans_set=[], seqtrans_device="cpu")
    with pytest.raises(SystemExit, match="model.causal_encoder=true.*decode.wait_k"):
        Agent(args)


def test_words_the_task_cannot_read_are_a_data_error_naming_the_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.errors import DataError

    loaded = loaded_copy(streaming_model(1, g=3.0, r=0.5))

    def unreadable(line: str) -> list[int]:
        raise ValueError(f"no symbol {line!r}")

    monkeypatch.setattr(loaded.task, "parse_source", unreadable)
    session = StreamSession(loaded, origin="<stdin>", line=3)
    with pytest.raises(DataError, match=r"<stdin>:3.*cannot read these words \(ValueError: no symbol '1'\)"):
        session.push("1")


class Letters:
    """A character-level task around the copy task's symbols: ``"0123"`` is four tokens,
    streamed one character at a time."""

    stream_unit = "characters"

    def parse_source(self, line: str) -> str:
        return line

    def format(self, prediction: str) -> str:
        return prediction


class LettersCodec(CopyCodec):
    def source_tokens(self, source: str) -> list[str]:  # type: ignore[override]
        return list(source)

    def prediction(self, tokens: list[str], source: str) -> str:  # type: ignore[override]
        return "".join(tokens)


def _letters(model: Transformer) -> loading.Loaded:
    words = loaded_copy(model)
    return dataclasses.replace(words, task=Letters(), codec=LettersCodec(words.codec.vocabularies))


def test_a_task_that_streams_characters_reads_them_as_words_are_read() -> None:
    model = streaming_model(3, g=1.0, r=3.0)
    by_word = seqtrans.stream(loaded_copy(model))
    for word in "0 1 2 3 4 5 6 5".split():
        by_word.push(word)
    by_word.finish()
    letters = _letters(model)
    by_char = seqtrans.stream(letters)
    updates = [by_char.push(c) for c in "0123"] + [by_char.push("4565"), by_char.finish()]
    assert by_char.words == list("01234565") and by_char.source == "01234565"  # no spaces to type
    assert [(t.id, t.delay, t.word_delay) for t in by_char.tokens] == [
        (t.id, t.delay, t.word_delay) for t in by_word.tokens]  # the same tokens at the same points
    assert by_char.output == "".join(by_word.output.split())
    assert [w.text for u in updates for w in u.words] == list(by_char.output)  # its units: characters
    assert by_char.word_delays == by_word.word_delays
    with pytest.raises(UsageError, match="streams characters: push one character"):
        seqtrans.stream(letters).push(["01"])


def test_stdin_arrives_character_by_character_for_such_a_task() -> None:
    assert list(streaming_input.words_of(["0 1\r\n", "2", "3\n4"], unit="characters")) == [
        "0", " ", "1", None, "2", "3", None, "4", None]
    assert list(streaming_input.words_of(["0 1\n4"])) == ["0", "1", None, "4", None]
    model = streaming_model(3, g=1.0, r=3.0)
    by_word, by_char = Arrivals("0 1 2 3\n"), Arrivals("")
    by_char.events = list(streaming_input.words_of(["0123\n"], unit="characters"))
    streaming_input.stream(loaded_copy(model), by_word, by_word.write)
    streaming_input.stream(_letters(model), by_char, by_char.write)
    assert by_char.log == by_word.log  # the same tokens written after the same units read
