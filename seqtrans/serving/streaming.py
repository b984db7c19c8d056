"""Simultaneous translation over a WebSocket (``/v1/models/{name}/stream``): the client
sends words as they are typed or recognised, and the server sends each target token as
soon as it is decided (:func:`seqtrans.decoding.streaming.stream_greedy`), with its delay:
the source tokens read when it was written.

Client messages (JSON): ``{"words": "some words"}`` adds whole words to the current
sentence; ``{"end": true}`` ends it. Server messages: ``{"token": T, "delay": N}`` per
target token; ``{"done": true, "output": TEXT, "delays": [...]}`` when the sentence's
output is complete (words still arriving for that sentence are then skipped until its
end); ``{"error": {...}}`` before closing on a bad message. A session then goes on with
the next sentence. Each session decodes in a thread of its own, since it waits for words
as it decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from seqtrans.data import prediction, source_ids
from seqtrans.errors import SeqtransError
from seqtrans.inference.ensemble import position_limit
from seqtrans.serving import validation
from seqtrans.serving.models import RequestError, Served

if TYPE_CHECKING:
    from seqtrans.serving.app import Server

END = None  # the end of a sentence, in the queue of words
#: What sending to, or closing, a connection the client has already closed raises.
GONE = (WebSocketDisconnect, RuntimeError, OSError)
log = logging.getLogger(__name__)


class _Closed(Exception):
    """The client has gone: the session's thread stops."""


_CLOSED = object()


async def stream(server: Server, ws: WebSocket) -> None:
    name = ws.path_params["name"]
    await ws.accept()
    try:
        served = server.model(name)
        if not served.streams:
            raise RequestError(422, "cannot_stream", f"model {name!r} cannot decode a stream (it needs a "
                               "causal encoder and attention that decides when to read: monotonic, milk or "
                               "wait-k)")
        if server.streams >= server.settings.max_streams:
            raise RequestError(503, "too_many_streams", f"{server.settings.max_streams} sessions are open "
                               "already; try again shortly", limit="max_streams")
    except RequestError as exc:
        await ws.send_json(exc.body())
        await ws.close(code=1013 if exc.status == 503 else 1008)
        return
    server.streams += 1
    server.metrics.streams.set(server.streams)
    loop = asyncio.get_running_loop()
    words: queue.Queue[Any] = queue.Queue()
    replies: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    ended = asyncio.Event()  # the session's thread has stopped (the client went, or it failed)

    def reply(message: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(replies.put_nowait, message)

    def session() -> None:
        try:
            _session(served, words, reply)
        finally:
            loop.call_soon_threadsafe(ended.set)

    threading.Thread(target=session, daemon=True, name=f"seqtrans-stream-{name}").start()
    sending = asyncio.create_task(_send(ws, replies))
    receiving = asyncio.create_task(_receive(ws, words, server.settings.max_input_tokens))
    stopped = asyncio.create_task(ended.wait())
    try:
        await asyncio.wait({receiving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        problem = receiving.exception() if receiving.done() else None
        if isinstance(problem, RequestError):
            reply(problem.body())
    finally:
        receiving.cancel()
        words.put(_CLOSED)
        await stopped
        reply(None)
        await sending
        server.streams -= 1
        server.metrics.streams.set(server.streams)
        with contextlib.suppress(*GONE):
            await ws.close()


async def _receive(ws: WebSocket, words: queue.Queue[Any], max_words: int) -> None:
    """Pass the client's words and sentence ends to the session until it disconnects."""
    count = 0
    while True:
        try:
            message = validation.read(await ws.receive_text())  # 400 or 422 as on the HTTP routes
        except (ValueError, KeyError):  # not JSON, or not text
            raise RequestError(400, "malformed_json", "each message must be a JSON object") from None
        if not isinstance(message, dict) or not (set(message) <= {"words", "end"}) or not message:
            raise RequestError(422, "invalid_message", 'a message is {"words": "..."} or {"end": true}')
        text = message.get("words")
        if text is not None:
            if not isinstance(text, str):
                raise RequestError(422, "invalid_message", "'words' must be a string")
            for word in text.split():
                count += 1
                if count > max_words:  # a word is at least one source token
                    raise RequestError(422, "input_too_long", f"more than {max_words} words in one sentence",
                                       limit="max_input_tokens")
                words.put(word)
        if message.get("end") is True:
            words.put(END)
            count = 0


async def _send(ws: WebSocket, replies: asyncio.Queue[dict[str, Any] | None]) -> None:
    while (message := await replies.get()) is not None:
        with contextlib.suppress(*GONE):
            await ws.send_json(message)


def _session(served: Served, words: queue.Queue[Any], reply: Callable[[dict[str, Any] | None], None]) -> None:
    """Decode sentence after sentence from the queue of words until the client goes."""
    from seqtrans.decoding.streaming import stream_greedy

    loaded = served.loaded
    decode = dataclasses.replace(loaded.config.decode, nbest=1, sample=0)
    target = loaded.codec.vocabularies.target
    limit = position_limit(loaded.model)
    try:
        while True:
            first = _next(words)
            if first is END:
                reply({"done": True, "output": "", "delays": []})
                continue
            arrived: list[str] = [first]
            tokens: list[int] = []
            delays: list[int] = []
            for emission in stream_greedy(loaded.model, _ids(served, words, arrived), decode,
                                          position_limit=limit):
                tokens.append(emission.token)
                delays.append(emission.delay)
                reply({"token": " ".join(target.decode([emission.token])), "delay": emission.delay})
            while arrived[-1:] != [""] and (word := _next(words)) is not END:
                arrived.append(word)  # the rest of a sentence whose output is complete
            source = loaded.task.parse_source(" ".join(w for w in arrived if w))
            reply({"done": True, "output": loaded.task.format(prediction(loaded.codec, tokens, source)),
                   "delays": delays})
    except _Closed:
        return
    except SeqtransError as exc:
        reply({"error": {"code": "invalid_input", "message": getattr(exc, "problem", str(exc))}})
    except Exception:
        log.exception("a streaming session of %s failed", served.name)
        reply({"error": {"code": "internal_error", "message": "the server failed to decode this sentence; "
                         "its log says why"}})


def _next(words: queue.Queue[Any]) -> Any:
    item = words.get()
    if item is _CLOSED:
        raise _Closed
    return item


def _ids(served: Served, words: queue.Queue[Any], arrived: list[str]) -> Iterator[int]:
    """The source ids of a sentence's words as they arrive (the task reads the words so
    far; their tokens must extend those of fewer words). ``arrived`` gets each word, and
    "" once the sentence's end is read."""
    loaded = served.loaded
    limit = loaded.model.config.position_limit
    fed: list[int] = []
    while True:
        ids = source_ids(loaded.codec, loaded.task.parse_source(" ".join(arrived)))[:-1]
        if limit is not None and len(ids) + 1 > limit:
            raise SeqtransError(f"{len(ids) + 1} source tokens (with the end symbol), more than the {limit} "
                                "positions the model learned (model.max_positions)")
        if ids[: len(fed)] != fed:
            raise SeqtransError("the task's tokens of the words read so far are not a prefix of those of "
                                "more words: this task cannot be streamed word by word")
        yield from ids[len(fed):]
        fed = ids
        word = _next(words)
        if word is END:
            arrived.append("")
            return
        arrived.append(word)
