"""Streaming sessions of the decoding core: a client's sentences, each decoded as its
words arrive (a :class:`~seqtrans.streaming.session.StreamSession` per sentence), one
message at a time. :meth:`Stream.take` takes a client's message (:data:`STREAM_MESSAGE`)
and returns the messages to send back (:mod:`seqtrans.serving.answers`); the WebSocket
adapter (:mod:`seqtrans.streaming.websocket`) only carries them.

A session's steps all decode on one of the server's decoding workers, a step of work per
message, so a session holds no thread while it waits for words. Words that arrive for a
sentence whose output is complete are skipped, uncounted, until its end; a sentence ended
without words gets an empty output at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from concurrent.futures import Executor
from typing import Any

from prometheus_client import Gauge

from seqtrans.errors import SeqtransError
from seqtrans.serving import answers
from seqtrans.serving.errors import RequestError
from seqtrans.serving.models import Served
from seqtrans.serving.requests import STREAM_MESSAGE
from seqtrans.serving.settings import ServeSettings
from seqtrans.streaming.session import StreamSession, Update, split_units
from seqtrans.tasks.protocol import stream_unit

log = logging.getLogger(__name__)


class StreamSlots:
    """The sessions open now, at most ``limit``, shown on the ``gauge`` of the metrics."""

    def __init__(self, *, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.gauge = gauge
        self.open = 0

    def take(self) -> None:
        """Count a new session in; a ``too_many_streams`` error when all slots are taken."""
        if self.open >= self.limit:
            raise RequestError("too_many_streams", f"{self.limit} sessions are open already; try again "
                               "shortly", limit="max_streams")
        self.open += 1
        self.gauge.set(self.open)

    def give_back(self) -> None:
        self.open -= 1
        self.gauge.set(self.open)


class Stream:
    """One client's sentences, one after the other, decoded on ``executor``; it holds one
    of ``slots`` until :meth:`close`."""

    def __init__(self, served: Served, settings: ServeSettings, executor: Executor,
                 slots: StreamSlots) -> None:
        self.served = served
        self.settings = settings
        self.executor = executor
        self.slots = slots
        self.decode = dataclasses.replace(served.loaded.config.decode, nbest=1, sample=0)
        self.unit = stream_unit(served.loaded.task)  # what "words" holds: words, or characters
        self.session: StreamSession | None = None
        self.words = 0  # of the current sentence
        self.done = False  # the current sentence's output is complete
        self.closed = False

    async def take(self, message: Any) -> list[dict[str, Any]]:
        """The messages that answer a client's ``message`` (parsed JSON); a
        :class:`RequestError` ends the session."""
        given = STREAM_MESSAGE.read(message, self.settings)
        words, end = split_units(given.get("words") or "", self.unit), given["end"]
        out: list[dict[str, Any]] = []
        if not self.done:  # words for a sentence whose output is complete are skipped, uncounted
            self._count(words)
            if words or (end and self.session is not None):
                out += await self._decode(words, end)
        if end:
            if not self.done:  # no words at all: the output is empty, and nothing is decoded
                out.append(answers.done("", [], []))
            self.session, self.words, self.done = None, 0, False
        return out

    def close(self) -> None:
        """Free the session's slot (once)."""
        if not self.closed:
            self.closed = True
            self.slots.give_back()

    def _count(self, words: list[str]) -> None:
        """Count the current sentence's words; ``input_too_long`` past ``max_input_tokens``."""
        self.words += len(words)
        if self.words > self.settings.max_input_tokens:  # a word is at least one source token
            raise RequestError("input_too_long", f"more than {self.settings.max_input_tokens} {self.unit} "
                               "in one sentence", limit="max_input_tokens")

    async def _decode(self, words: list[str], end: bool) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        try:
            update = await loop.run_in_executor(self.executor, self._step, words, end)
        except SeqtransError as exc:
            raise RequestError("invalid_input", getattr(exc, "problem", str(exc))) from None
        except Exception:
            log.exception("a streaming session of %s failed", self.served.name)
            raise RequestError("internal_error", "the server failed to decode this sentence; its log says "
                               "why") from None
        out = answers.streamed(update)
        if update.done:
            session = self.session
            assert session is not None
            self.done = True
            out.append(answers.done(session.output, session.word_delays, session.token_delays))
        return out

    def _step(self, words: list[str], end: bool) -> Update:
        """On the session's decoding worker: push the words, end the sentence if told."""
        if self.session is None:
            self.session = StreamSession(self.served.loaded, decode=self.decode, origin="stream")
        update = self.session.push(words)
        if end and not update.done:
            later = self.session.finish()
            update = Update(update.tokens + later.tokens, update.words + later.words, later.done)
        return update
