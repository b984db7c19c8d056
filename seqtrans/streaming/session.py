"""A push-style streaming session: one sentence decoded while its words arrive.

::

    model = seqtrans.load("runs/multik", overrides=["decode.wait_k=3"])
    session = seqtrans.stream(model)
    for word in "A man is riding a bicycle .".split():
        update = session.push(word)        # the tokens and words now decided
    update = session.finish()              # the rest of the output
    print(session.output, session.word_delays)

This is the one implementation of streaming by words: ``predict --stream``, ``evaluate
--stream``, the server's WebSocket and the SimulEval agent (:mod:`seqtrans.streaming.simuleval`)
all drive it. It needs no thread: each call decodes as far as the words at hand allow
(:class:`~seqtrans.streaming.decoder.StreamDecoder`) and returns.

The task's tokenisation is applied to the words pushed so far and the new tokens are fed
to the model; the tokens of the first n words must be a prefix of those of the first
n + 1 (true of whitespace tokens and of sentencepiece), else :class:`DataError`. Tokens
every output starts with (a target language's code, the codec's ``target_prefix``) are
forced, as offline decoding forces them, and are not among the tokens written.

Delays, in source words read: a target token's ``word_delay`` is the number of words up
to the one holding the last source token the model had read when it decided the token
(all words once the source has ended and every token was read). An output word's delay
is what a reader of the text sees: the words read when the word is known to be complete,
that is when the next target token begins a new word, or when the end of the output is
decided. An output word is then not known before its last piece, and often one token
later; SimulEval measures the same for an agent that writes each word once it is
complete. The output's words are those of the task's output line
(:meth:`~seqtrans.tasks.Task.format`) split on whitespace, taken from the line of the
tokens decided so far: for tasks whose line of a prefix is a prefix of the final line
(sentencepiece and whitespace tokens) the words written equal the final output's.

A task whose ``stream_unit`` is "characters" (:func:`~seqtrans.tasks.protocol.stream_unit`)
streams characters instead: a pushed string is split into its characters (white space
included, line breaks left out), the source line is their concatenation, delays count
characters read, and the output's units are its characters other than white space.
Everything said of words above holds of these units.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from seqtrans.config import DecodeConfig
from seqtrans.data.batches import prediction, source_ids
from seqtrans.data.encoding import forced_prefix
from seqtrans.decoding.ensemble import position_limit
from seqtrans.errors import DataError, SeqtransError, UsageError
from seqtrans.inference.loaded import Loaded
from seqtrans.streaming.decoder import Emission, StreamDecoder, check_streamable
from seqtrans.tasks.protocol import stream_unit


@dataclass(frozen=True)
class Token:
    """A target token as soon as it is decided."""

    id: int
    text: str  # as the target vocabulary writes it
    delay: int  # source tokens read when it was decided
    word_delay: int  # source words read when it was decided


@dataclass(frozen=True)
class Word:
    """An output word once it is known to be complete."""

    text: str
    delay: int  # source words read when it was known to be complete


@dataclass(frozen=True)
class Update:
    """What one :meth:`StreamSession.push` or :meth:`StreamSession.finish` decided."""

    tokens: list[Token]
    words: list[Word]  # output words now complete, in order
    done: bool  # the output has ended (words pushed later are only counted)


def split_units(text: str, unit: str) -> list[str]:
    """A source text as the units of a stream: its words (``unit`` "words"), or its
    characters, line breaks left out ("characters")."""
    return text.split() if unit == "words" else [ch for ch in text if ch not in "\r\n"]


def join_units(units: Iterable[str], unit: str) -> str:
    """The source line of a stream's units: words separated by a space, characters side by side."""
    return (" " if unit == "words" else "").join(units)


def output_units(line: str, unit: str) -> list[str]:
    """An output line's units: its words, or its characters other than white space."""
    return line.split() if unit == "words" else [ch for ch in line if not ch.isspace()]


def check_streaming(loaded: Loaded) -> None:
    """Raise :class:`UsageError` unless ``loaded`` can decode streams: one model, that can
    stream, one output per input."""
    if loaded.others:
        raise UsageError("streaming decodes with one model, not an ensemble")
    check_streamable(loaded.model)
    decode = loaded.config.decode
    if decode.nbest > 1:
        raise UsageError("streaming decodes greedily: decode.nbest must be 1")
    if decode.sample:
        raise UsageError("streaming decodes greedily: decode.sample must be 0")
    if decode.no_repeat_ngram_size:
        raise UsageError("streaming has no decode.no_repeat_ngram_size: it must be 0")
    if decode.banned:
        raise UsageError("streaming has no decode.banned: it must be empty")


class StreamSession:
    """One sentence decoded as its words are pushed (see the module docstring).

    ``decode`` replaces the run's decoding settings (greedy ones: ``nbest`` 1, no
    sampling); ``origin`` and ``line`` name the input in errors.
    """

    def __init__(self, loaded: Loaded, *, decode: DecodeConfig | None = None, origin: str = "<stream>",
                 line: int | None = None) -> None:
        if decode is not None:  # its languages may not be the run's: the codec bound to them
            loaded = dataclasses.replace(loaded, codec=loaded.codec_for(decode),
                                         config=dataclasses.replace(loaded.config, decode=decode))
        check_streaming(loaded)
        self.loaded = loaded
        self.origin, self.line = origin, line
        self._decoder = StreamDecoder(loaded.model, loaded.config.decode,
                                      position_limit=position_limit(loaded.model),
                                      prefix=forced_prefix(loaded.codec))
        self._source_limit = loaded.model.config.position_limit
        self.unit = stream_unit(loaded.task)  # "words", or "characters" for a task that says so
        self.words: list[str] = []  # the source words (or characters) pushed
        self._ends: list[int] = []  # source tokens of the first k words, at k - 1
        self._fed: list[int] = []  # the source ids of the words pushed
        self._given = 0  # of which the decoder has been given these
        self.tokens: list[Token] = []
        self._line_counts: list[int] = []  # words in the output line after each token
        self._written: list[Word] = []
        self.finished = False

    # ------------------------------------------------------------------ input

    def push(self, words: str | Iterable[str]) -> Update:
        """Add source words (a string is split on whitespace), or characters (a string is
        split into them) for a task that streams characters; what is now decided."""
        if self.finished:
            raise UsageError("this stream's source has ended (finish() was called): start a new session "
                             "for the next sentence")
        for word in split_units(words, self.unit) if isinstance(words, str) else words:
            self._check_unit(word)
            self.words.append(word)
            if not self._decoder.done:  # an output that has ended reads nothing more
                self._ends.append(len(self._feed()))
        if self._decoder.done:
            return self._decide([])
        new, self._given = self._fed[self._given:], len(self._fed)
        return self._decide(self._decoder.push(new))

    def _check_unit(self, unit: str) -> None:
        if self.unit == "words" and (not unit or any(ch.isspace() for ch in unit)):
            raise UsageError(f"a pushed word must be non-empty and hold no whitespace: {unit!r}")
        if self.unit == "characters" and (len(unit) != 1 or unit in "\r\n"):
            raise UsageError(f"this task streams characters: push one character (not a line break) at a "
                             f"time, or a string, got {unit!r}")

    def finish(self) -> Update:
        """End the source; the rest of the output."""
        if self.finished:
            raise UsageError("finish() was already called on this stream")
        self.finished = True
        emissions = [] if self._decoder.done else self._decoder.finish()
        return self._decide(emissions)

    def _feed(self) -> list[int]:
        try:
            ids = source_ids(self.loaded.codec, self.source)[:-1]
        except SeqtransError:
            raise
        except Exception as exc:  # the task's own failure on what it was given: still bad input
            raise DataError(self.origin, self.line, f"the task cannot read these words "
                                                    f"({type(exc).__name__}: {exc})") from exc
        if ids[: len(self._fed)] != self._fed:
            raise DataError(self.origin, self.line,
                            f"the task's tokens of the {self.unit} read so far are not a prefix of those of "
                            f"more {self.unit}: this task cannot be streamed {self.unit[:-1]} by "
                            f"{self.unit[:-1]}")
        if self._source_limit is not None and len(ids) + 1 > self._source_limit:
            raise DataError(self.origin, self.line,
                            f"{len(ids) + 1} source tokens (with the end symbol), more than the "
                            f"{self._source_limit} positions the model learned (model.max_positions)")
        self._fed = ids
        return ids

    # ------------------------------------------------------------------ output

    def _word_delay(self, delay: int) -> int:
        """Source tokens read as words read: the word holding the last token read (0
        before any); every word once the source has ended and every token was read."""
        if delay == 0:
            return 0
        if self.finished and (not self._ends or delay >= self._ends[-1]):
            return len(self.words)
        return bisect.bisect_left(self._ends, delay) + 1

    def _line_words(self) -> list[str]:
        return output_units(self.output, self.unit)

    def _decide(self, emissions: list[Emission]) -> Update:
        target = self.loaded.codec.vocabularies.target
        tokens: list[Token] = []
        words: list[Word] = []
        for emission in emissions:
            delay = self._word_delay(emission.delay)
            token = Token(emission.token, " ".join(target.decode([emission.token])), emission.delay, delay)
            self.tokens.append(token)
            tokens.append(token)
            line = self._line_words()
            self._line_counts.append(len(line))
            # every word before the line's last is complete once this token is decided
            words += self._complete(line[:-1], delay)
        if self._decoder.done:
            end = self._decoder.end_delay
            assert end is not None
            words += self._complete(self._line_words(), self._word_delay(end))
        return Update(tokens, words, self._decoder.done)

    def _complete(self, line: list[str], delay: int) -> list[Word]:
        new = [Word(text, max(delay, self._written[-1].delay if self._written else 0))
               for text in line[len(self._written):]]
        self._written += new
        return new

    # ------------------------------------------------------------------ results

    @property
    def done(self) -> bool:
        """The output has ended."""
        return self._decoder.done

    @property
    def source(self) -> Any:
        """The task's source of the words (or characters) pushed so far."""
        return self.loaded.task.parse_source(join_units(self.words, self.unit))

    @property
    def source_tokens(self) -> int:
        """The number of source tokens of the words pushed (the end symbol not counted)."""
        return len(source_ids(self.loaded.codec, self.source)) - 1

    @property
    def prediction(self) -> Any:
        """The task's prediction from the tokens decided so far."""
        return prediction(self.loaded.codec, [t.id for t in self.tokens], self.source)

    @property
    def output(self) -> str:
        """The output line of the tokens decided so far (:meth:`~seqtrans.tasks.Task.format`)."""
        return self.loaded.task.format(self.prediction)

    @property
    def output_words(self) -> list[Word]:
        """The output words known to be complete so far, with their delays."""
        return list(self._written)

    @property
    def word_delays(self) -> list[int]:
        """Each complete output word's delay in source words, as a reader of the text sees it."""
        return [w.delay for w in self._written]

    @property
    def piece_delays(self) -> list[int]:
        """Each complete output word's delay in source words as that of its last piece:
        the token before the one that begins the next word, or the last token. A lower
        bound of :attr:`word_delays`."""
        counts = self._line_counts
        out: list[int] = []
        for j in range(1, len(self._written) + 1):
            begins = next((i for i, c in enumerate(counts) if c > j), len(counts))  # word j + 1 begins
            out.append(max(out[-1] if out else 0, self.tokens[max(begins - 1, 0)].word_delay))
        return out

    @property
    def token_delays(self) -> list[int]:
        """Each target token's delay in source tokens."""
        return [t.delay for t in self.tokens]

    @property
    def end_delay(self) -> int | None:
        """Source tokens read when the end of the output was decided (None before)."""
        return self._decoder.end_delay


def stream(loaded: Loaded, *, decode: DecodeConfig | None = None, origin: str = "<stream>",
           line: int | None = None) -> StreamSession:
    """A :class:`StreamSession` for one sentence of a loaded model that can stream."""
    return StreamSession(loaded, decode=decode, origin=origin, line=line)
