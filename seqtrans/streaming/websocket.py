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

A session then goes on with the next sentence. Sessions are the decoding core's
(:mod:`seqtrans.serving.streams`); this adapter only carries messages between the
connection and a session, and closes the connection on an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from seqtrans.serving import validation
from seqtrans.serving.errors import RequestError
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.streams import Stream

#: What sending to, or closing, a connection the client has already closed raises.
GONE = (WebSocketDisconnect, RuntimeError, OSError)
#: What :func:`_receive` returns once the client has closed (a message may be JSON null).
CLOSED = object()


class StreamHost(Protocol):
    """What a connection needs of the server (:class:`~seqtrans.serving.core.Core`)."""

    settings: ServeSettings

    def open_stream(self, name: str) -> Stream: ...


async def stream(host: StreamHost, ws: WebSocket) -> None:
    """Serve one WebSocket connection's sentences until the client leaves or errs."""
    await ws.accept()
    try:
        session = host.open_stream(ws.path_params["name"])
    except RequestError as exc:
        await _send(ws, exc.body())
        await ws.close(code=1013 if exc.status == 503 else 1008)
        return
    try:
        while (message := await _receive(ws, host.settings.stream_idle_s)) is not CLOSED:
            for answer in await session.take(message):
                await _send(ws, answer)
    except RequestError as exc:
        await _send(ws, exc.body())
    finally:
        session.close()
        with contextlib.suppress(*GONE):
            await ws.close()


async def _send(ws: WebSocket, message: dict[str, Any]) -> None:
    with contextlib.suppress(*GONE):
        await ws.send_json(message)


async def _receive(ws: WebSocket, idle_s: float) -> Any:
    """The next message as JSON (:func:`seqtrans.serving.validation.read`: 400 or 422 as on
    the HTTP routes); :data:`CLOSED` when the client has gone."""
    try:
        raw = await asyncio.wait_for(ws.receive_text(), timeout=idle_s)
    except asyncio.TimeoutError:
        raise RequestError("idle_timeout", f"no message for {idle_s:g} s", limit="stream_idle_s") from None
    except WebSocketDisconnect:
        return CLOSED
    except KeyError:  # a binary message
        raise RequestError("malformed_json", "each message must be a JSON object") from None
    return validation.read(raw)
