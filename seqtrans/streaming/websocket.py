"""Simultaneous translation over a WebSocket (``/v1/models/{name}/stream``): the client
sends words as they are typed or recognised, and the server sends each target token as
soon as it is decided, and each output word once it is known to be complete, through a
:class:`~seqtrans.streaming.session.StreamSession` per sentence.

Client messages (JSON): ``{"words": "some words"}`` adds whole words to the current
sentence; ``{"end": true}`` ends it (both may come in one message). Server messages:

- ``{"token": T, "delay": N, "word_delay": W}`` per target token: its text, and the
  source tokens and source words read when it was decided;
- ``{"word": TEXT, "delay": W}`` per output word once it is complete (the next token
  begins a new word, or the output has ended), W the source words read by then: the
  delay a reader of the text sees;
- ``{"done": true, "output": TEXT, "delays": [W, ...], "token_delays": [N, ...]}`` when
  the sentence's output is complete, ``delays`` those of its words and ``token_delays``
  those of its tokens (words still arriving for that sentence are then skipped, and not
  counted against ``max_input_tokens``, until its end); a sentence ended without words
  gets an empty output at once;
- ``{"error": {...}}`` before closing on a bad message, or after ``stream_idle_s``
  seconds without one (``idle_timeout``).

For a task whose ``stream_unit`` is "characters", ``words`` holds characters instead
(each one a unit, white space included) and the delays count characters.

A session then goes on with the next sentence. Decoding runs on one of the server's
decoding workers, those the batches of predict requests use, a step of work per message:
a session holds no thread while it waits for words.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import reprlib
from concurrent.futures import Executor
from typing import Any, Protocol

from prometheus_client import Gauge
from starlette.websockets import WebSocket, WebSocketDisconnect

from seqtrans.errors import SeqtransError
from seqtrans.serving import validation
from seqtrans.serving.models import RequestError, Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.streaming.session import StreamSession, Update, split_units
from seqtrans.tasks.protocol import stream_unit

#: What sending to, or closing, a connection the client has already closed raises.
GONE = (WebSocketDisconnect, RuntimeError, OSError)
log = logging.getLogger(__name__)


class StreamSlots:
    """The sessions open now, at most ``limit``, shown on the ``gauge`` of the metrics."""

    def __init__(self, *, limit: int, gauge: Gauge) -> None:
        self.limit = limit
        self.gauge = gauge
        self.open = 0

    def take(self) -> None:
        """Count a new session in; a 503 :class:`RequestError` when all slots are taken."""
        if self.open >= self.limit:
            raise RequestError(503, "too_many_streams", f"{self.limit} sessions are open already; try "
                               "again shortly", limit="max_streams")
        self.open += 1
        self.gauge.set(self.open)

    def give_back(self) -> None:
        self.open -= 1
        self.gauge.set(self.open)


class StreamHost(Protocol):
    """What a streaming session needs of the server (:class:`~seqtrans.serving.app.Server`)."""

    settings: ServeSettings
    slots: StreamSlots

    def model(self, name: str) -> Served: ...

    def decoding_thread(self) -> Executor: ...


async def stream(host: StreamHost, ws: WebSocket) -> None:
    """Serve one WebSocket connection's sentences until the client leaves or errs."""
    name = ws.path_params["name"]
    await ws.accept()
    try:
        served = host.model(name)
        if not served.streams:
            raise RequestError(422, "cannot_stream", f"model {name!r} cannot decode a stream (it needs "
                               "scaled-dot encoder-decoder attention, under wait-k, or a learned read policy "
                               "with a causal encoder: monotonic, milk, mocha, mma_hard or "
                               "mma_il or mma_chunk)")
        host.slots.take()
    except RequestError as exc:
        await _send(ws, exc.body())
        await ws.close(code=1013 if exc.status == 503 else 1008)
        return
    try:
        await _Session(host, served, ws).run()
    except RequestError as exc:
        await _send(ws, exc.body())
    finally:
        host.slots.give_back()
        with contextlib.suppress(*GONE):
            await ws.close()


async def _send(ws: WebSocket, message: dict[str, Any]) -> None:
    with contextlib.suppress(*GONE):
        await ws.send_json(message)


class _Session:
    """One client's sentences, one after the other."""

    def __init__(self, host: StreamHost, served: Served, ws: WebSocket) -> None:
        self.executor = host.decoding_thread()  # the session's steps all decode on one worker
        self.settings = host.settings
        self.served = served
        self.ws = ws
        config = served.loaded.config
        self.decode = dataclasses.replace(config.decode, nbest=1, sample=0)
        self.session: StreamSession | None = None
        self.unit = stream_unit(served.loaded.task)  # what "words" holds: words, or characters
        self.words = 0  # of the current sentence
        self.done = False  # the current sentence's output is complete

    async def run(self) -> None:
        while True:
            message = await self._receive()
            if message is None:
                return
            words, end = message
            if not self.done:  # words for a sentence whose output is complete are skipped, uncounted
                self._count(words)
                if words or (end and self.session is not None):
                    await self._decode(words, end)
            if end:
                if not self.done:  # no words at all: the output is empty, and nothing is decoded
                    await _send(self.ws, {"done": True, "output": "", "delays": [], "token_delays": []})
                self.session, self.words, self.done = None, 0, False

    def _count(self, words: list[str]) -> None:
        """Count the current sentence's words; 422 past ``max_input_tokens``."""
        self.words += len(words)
        if self.words > self.settings.max_input_tokens:  # a word is at least one source token
            raise RequestError(422, "input_too_long", f"more than {self.settings.max_input_tokens} "
                               f"{self.unit} in one sentence", limit="max_input_tokens")

    async def _receive(self) -> tuple[list[str], bool] | None:
        """The next message's words and whether it ends the sentence; None when the client has gone."""
        try:
            raw = await asyncio.wait_for(self.ws.receive_text(), timeout=self.settings.stream_idle_s)
        except asyncio.TimeoutError:
            raise RequestError(408, "idle_timeout", f"no message for {self.settings.stream_idle_s:g} s",
                               limit="stream_idle_s") from None
        except WebSocketDisconnect:
            return None
        except KeyError:  # a binary message
            raise RequestError(400, "malformed_json", "each message must be a JSON object") from None
        message = validation.read(raw)  # 400 or 422 as on the HTTP routes (lone surrogates, NaN, depth)
        if not isinstance(message, dict) or not (set(message) <= {"words", "end"}) or not message:
            raise RequestError(422, "invalid_message", 'a message is {"words": "..."} or {"end": true}')
        text = message.get("words")
        if text is not None and not isinstance(text, str):
            raise RequestError(422, "invalid_message", "'words' must be a string")
        end = message.get("end", False)
        if not isinstance(end, bool):  # 1 or "true" is not taken as an end, nor silently dropped
            raise RequestError(422, "invalid_request",
                               f"'end' must be true or false, got {reprlib.repr(end)}", field="end")
        return split_units(text or "", self.unit), end

    async def _decode(self, words: list[str], end: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            update = await loop.run_in_executor(self.executor, self._step, words, end)
        except SeqtransError as exc:
            raise RequestError(422, "invalid_input", getattr(exc, "problem", str(exc))) from None
        except Exception:
            log.exception("a streaming session of %s failed", self.served.name)
            raise RequestError(500, "internal_error", "the server failed to decode this sentence; its log "
                               "says why") from None
        for token in update.tokens:
            await _send(self.ws, {"token": token.text, "delay": token.delay, "word_delay": token.word_delay})
        for word in update.words:
            await _send(self.ws, {"word": word.text, "delay": word.delay})
        if update.done:
            session = self.session
            assert session is not None
            self.done = True
            await _send(self.ws, {"done": True, "output": session.output, "delays": session.word_delays,
                                  "token_delays": session.token_delays})

    def _step(self, words: list[str], end: bool) -> Update:
        """On the session's decoding worker: push the words, end the sentence if told."""
        if self.session is None:
            self.session = StreamSession(self.served.loaded, decode=self.decode, origin="stream")
        update = self.session.push(words)
        if end and not update.done:
            later = self.session.finish()
            update = Update(update.tokens + later.tokens, update.words + later.words, later.done)
        return update
