"""HTTP connections: uvicorn's h11 protocol with a time limit on a request's headers.

uvicorn closes a connection idle between requests (``timeout_keep_alive``), but once a
client has sent a first byte it waits for the rest of the headers for ever, so a few
clients that send their headers a byte at a time ("slowloris") hold connections without
end. Here every request's line and headers must have arrived within ``header_timeout_s``
of the connection opening, or of the previous answer on a kept-alive connection; past
that the server closes the connection, answering 408 if part of a request had come. The body's own time counts
against the request's ``timeout_s`` (:mod:`seqtrans.serving.app`).

A request h11 cannot parse (``Content-Length: -5``, a header line without a colon, headers
over h11's 16 KiB, bytes that are not HTTP/1.1) never reaches the app: uvicorn answers it
400 itself, in plain text; here that answer is a JSON error like every other. So is a
WebSocket handshake the ``websockets`` library refuses (no ``Sec-WebSocket-Key``, another
``Sec-WebSocket-Version``), and one the app closes before accepting it (403).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.http11 import Response

log = logging.getLogger(__name__)

TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n%s")
BODY = b'{"error": {"code": "header_timeout", "message": "the request\'s headers did not arrive in time", ' \
       b'"limit": "header_timeout_s"}}'
NOT_HTTP = b'{"error": {"code": "bad_request", "message": "the request is not valid HTTP/1.1 (its request ' \
           b'line or headers could not be parsed)"}}'


class HeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are late."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request's headers are in (or the connection is done)
            self._headers_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_headers()  # the next request on this connection

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 could not parse, as JSON (``msg`` is uvicorn's
        fixed text); the connection then closes, as uvicorn's does."""
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(NOT_HTTP)).encode())]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=NOT_HTTP), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self._headers_due = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info("closed a connection from %s whose request headers took more than %g s", self.client,
                 self.header_timeout_s)
        if self.conn.our_state is h11.IDLE and self.conn.trailing_data[0]:
            # part of a request has come: say why it closes (an idle connection closes silently,
            # as at uvicorn's keep-alive timeout, lest a request crossing it read the 408)
            self.transport.write(TIMED_OUT % (len(BODY), BODY))
        self.transport.close()


def with_header_timeout(seconds: float) -> type[H11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` that waits ``seconds`` for a
    request's headers."""
    return type("HeaderTimeout", (HeaderTimeout,), {"header_timeout_s": seconds})


#: The error code of each status a WebSocket handshake may be refused with.
REFUSALS = {400: "bad_request", 403: "forbidden", 426: "upgrade_required", 500: "internal_error"}


def json_refusal(status: int | http.HTTPStatus, text: str) -> Response:
    """A WebSocket handshake refusal as a JSON error: what ``websockets``' ``reject``
    makes, with the body JSON instead of plain text."""
    status = http.HTTPStatus(status)
    message = text.strip() or status.phrase
    body = json.dumps({"error": {"code": REFUSALS.get(status.value, "http_error"), "message": message}})
    headers = Headers([("Connection", "close"), ("Content-Length", str(len(body))),
                       ("Content-Type", "application/json")])
    return Response(status.value, status.phrase, headers, body.encode())


class JsonRefusals(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, refusing handshakes with JSON errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # reject() is where websockets makes every refusal (and uvicorn its 403 and 500); the
        # connection object is built in uvicorn's __init__, so its reject is replaced here
        self.conn.reject = json_refusal  # type: ignore[method-assign]
