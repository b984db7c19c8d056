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
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from seqtrans.data import prediction, source_ids
from seqtrans.errors import SeqtransError
from seqtrans.inference.ensemble import position_limit
from seqtrans.serving.models import RequestError, Served

if TYPE_CHECKING:
    from seqtrans.serving.app import Server

END = None  # the end of a sentence, in the queue of words


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

    def reply(message: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(replies.put_nowait, message)

    worker = threading.Thread(target=_session, args=(served, words, reply), daemon=True,
                              name=f"seqtrans-stream-{name}")
    worker.start()
    sending = asyncio.create_task(_send(ws, replies))
    try:
        await _receive(ws, words, server.settings.max_input_tokens)
    except RequestError as exc:
        reply(exc.body())
    except WebSocketDisconnect:
        pass
    finally:
        words.put(_CLOSED)
        await loop.run_in_executor(None, worker.join)
        reply(None)
        await sending
        server.streams -= 1
        server.metrics.streams.set(server.streams)
        with _quietly():
            await ws.close()


async def _receive(ws: WebSocket, words: queue.Queue[Any], max_words: int) -> None:
    """Pass the client's words and sentence ends to the session until it disconnects."""
    count = 0
    while True:
        try:
            message = await ws.receive_json()
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
        with _quietly():
            await ws.send_json(message)


class _quietly:
    """Ignore a send or close on a connection the client has already closed."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (WebSocketDisconnect, RuntimeError, OSError))


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
    fed: list[int] = []
    while True:
        ids = source_ids(loaded.codec, loaded.task.parse_source(" ".join(arrived)))[:-1]
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
