"""``seqtrans predict --stream``: inputs that arrive word by word (or character by
character, for a task whose ``stream_unit`` says so), decoded simultaneously
through a :class:`~seqtrans.streaming.session.StreamSession` per input line, each
target token written as soon as it is decided."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from seqtrans.inference.loaded import Loaded
from seqtrans.inference.online import warn_unseen
from seqtrans.streaming.latency import corpus_latency, sentence_latency
from seqtrans.streaming.session import StreamSession, check_streaming

log = logging.getLogger(__name__)


def stream(loaded: Loaded, words: Iterable[str | None], write: Callable[[str], None]) -> None:
    """Simultaneous decoding of inputs that arrive word by word, one
    :class:`~seqtrans.streaming.session.StreamSession` per input line.

    ``words`` yields each input's words as they arrive and ``None`` where an input line
    ends. Each target token is passed to ``write`` as soon as it is decided (the model's
    target tokens, space-separated); when an input's output is complete, a tab, the delays
    (the source tokens read when each token was written) and a line break follow, once
    the input line has ended. The latency metrics of :mod:`seqtrans.streaming.latency`
    (AP, AL, LAAL, DAL) are logged at the end, in source tokens and against the
    hypothesis length (there is no reference).
    """
    check_streaming(loaded)
    latencies = []
    number = 0
    session: StreamSession | None = None
    closed = False  # the current output's line has been written
    for word in words:
        if session is None:
            number += 1
            if word is None:  # an empty line: nothing to translate, nothing to wait for
                write("\t\n")
                continue
            session, closed = StreamSession(loaded, origin="<stdin>", line=number), False
        written = len(session.tokens)
        update = session.finish() if word is None else session.push((word,))
        for i, token in enumerate(update.tokens, start=written):
            write((" " if i else "") + token.text)
        if update.done and not closed:  # the rest of the line is not needed for decoding
            write("\t" + " ".join(map(str, session.token_delays)) + "\n")
            closed = True
        if word is None:
            warn_unseen(loaded, session.source, "<stdin>", number)
            latencies.append(sentence_latency(session.token_delays, source_length=session.source_tokens))
            session = None
    if latencies:
        scores = corpus_latency(latencies)
        log.info("streamed %d inputs: AP %.3f, AL %.2f, LAAL %.2f, DAL %.2f source tokens", len(latencies),
                 scores["ap"], scores["al"], scores["laal"], scores["dal"])


def words_of(chunks: Iterable[str], *, unit: str = "words") -> Iterator[str | None]:
    """The words of text arriving in chunks, each as soon as the whitespace after it has
    arrived, and ``None`` at each line break (and at the end of an unterminated last line).
    With ``unit`` "characters" (a task that streams characters), each character as it
    arrives instead, white space included."""
    if unit == "characters":
        yield from _characters_of(chunks)
        return
    word: list[str] = []
    pending_line = False
    for chunk in chunks:
        for ch in chunk:
            if ch.isspace():
                if word:
                    yield "".join(word)
                    word = []
                    pending_line = True
                if ch == "\n":
                    yield None
                    pending_line = False
            else:
                word.append(ch)
                pending_line = True
    if word:
        yield "".join(word)
    if pending_line:
        yield None


def _characters_of(chunks: Iterable[str]) -> Iterator[str | None]:
    """Each character of text arriving in chunks, and ``None`` at each line break (and at
    the end of an unterminated last line); carriage returns are left out."""
    pending_line = False
    for chunk in chunks:
        for ch in chunk:
            if ch == "\n":
                yield None
                pending_line = False
            elif ch != "\r":
                yield ch
                pending_line = True
    if pending_line:
        yield None
