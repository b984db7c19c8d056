"""A light HTTP/1.1 client for the load benchmarks: one kept-alive connection per user.

On a small machine the load generator runs on the cores the server under test decodes
on, so every CPU second the client spends is taken from the server: with httpx's
``AsyncClient`` (one per user) the clients of ``serve_load`` kept more of two cores busy
than the server did, and the benchmark measured the client. This client does only what
those requests need, on plain asyncio streams: a request's bytes are built once
(:func:`request`) and written as they are; an answer is read as its status line, its
headers and a body of ``Content-Length`` bytes, or up to the connection's end when it
gives none. It keeps the connection alive across requests, and opens a new one when the
server closed it (``Connection: close``, or a kept-alive connection it closed while
idle). It refuses a chunked answer (:class:`ProtocolError`): ``seqtrans serve``
(uvicorn's h11 protocol) sends ``Content-Length`` with every answer the benchmarks
request, since none of them is streamed.

httpx remains the client for everything else (readiness probes, metrics).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: Answers that never have a body (RFC 9112, section 6.3).
BODILESS = (204, 304)


class ProtocolError(Exception):
    """An answer this client cannot read: not HTTP/1.x, or framed in a way it does not take."""


#: What :meth:`Connection.send` raises when no whole answer came: the connection failed
#: (refused, reset, closed early: ``OSError``, ``EOFError``), the time limit passed, or
#: the answer could not be read.
ERRORS = (OSError, EOFError, asyncio.TimeoutError, ProtocolError)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its ``status``, its ``headers`` (names in lower case; a repeated
    header's values joined by ", ") and its ``body``."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _address(url: str) -> tuple[str, int, str]:
    """The host, the port and the path (with its query) of an ``http://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"an http:// URL with a host is needed, got {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, target


def request(method: str, url: str, *, body: bytes | None = None, content_type: str = "application/json",
            headers: Mapping[str, str] | None = None) -> bytes:
    """The bytes of an HTTP/1.1 request for ``url``, to send as they are on any connection
    to its host: ``body`` (when given) declared as ``content_type`` with its length, and
    ``headers`` added (``{"Connection": "close"}`` asks the server to close after answering)."""
    host, port, target = _address(url)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    if body is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """The status and headers of an answer's ``head`` (its status line and header lines,
    up to the blank line), and whether the server keeps the connection open after it
    (HTTP/1.1 unless ``Connection: close``; HTTP/1.0 only with ``Connection: keep-alive``)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"not a header line: {line[:80]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    kept = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
    return int(code), headers, kept


def body_length(status: int, headers: Mapping[str, str]) -> int | None:
    """How many bytes of body follow an answer's head; None: up to the connection's end."""
    if "transfer-encoding" in headers:
        raise ProtocolError(f"the answer is sent with Transfer-Encoding: {headers['transfer-encoding']}, "
                            "which this client does not read (it needs Content-Length, or the body "
                            "up to the connection's end)")
    if 100 <= status < 200:  # only sent to a request that expects it, which this client never makes
        raise ProtocolError(f"an interim answer ({status}) to a request that did not ask for one")
    if status in BODILESS:
        return 0
    if "content-length" not in headers:
        return None
    declared = headers["content-length"]
    if not declared.isdigit():  # a repeated header joined by ", " fails here too
        raise ProtocolError(f"not a body length: Content-Length: {declared!r}")
    return int(declared)


class Connection:
    """One user's connection to the server of ``url`` (its host and port; its path is not
    used): opened at the first request, kept alive between requests and opened anew when
    the server has closed it; a request waits at most ``timeout`` seconds for its whole
    answer. ``opened`` counts the connections made, one while the server keeps it alive."""

    def __init__(self, url: str, *, timeout: float = 120.0) -> None:
        self.host, self.port, _ = _address(url)
        self.timeout = timeout
        self.opened = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> Answer:
        """Send ``request`` (the bytes of :func:`request`) and read its answer. A request
        that finds its kept-alive connection closed before any byte of the answer came (the
        server closed it while idle, as the request went out) is sent once more on a new
        one. Raises one of :data:`ERRORS` when no whole answer came, after closing the
        connection, whose state is then unknown."""
        try:
            return await asyncio.wait_for(self._exchange(request), self.timeout)
        except BaseException:
            self._drop()
            raise

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:  # reset by the server: closed all the same
                pass

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exchange(self, request: bytes) -> Answer:
        reader = self._reader
        fresh = reader is None or reader.at_eof()
        if reader is None or fresh:
            reader = await self._open()
        try:
            head = await self._head(reader, request)
        except (EOFError, ConnectionResetError, BrokenPipeError) as exc:
            if fresh or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                raise
            reader = await self._open()
            head = await self._head(reader, request)
        status, headers, kept = parse_head(head)
        length = body_length(status, headers)
        body = await (reader.read() if length is None else reader.readexactly(length))
        if not kept or length is None:
            await self.close()
        return Answer(status, headers, body)

    async def _head(self, reader: asyncio.StreamReader, request: bytes) -> bytes:
        """Write ``request`` and read its answer's head, up to the blank line."""
        assert self._writer is not None
        self._writer.write(request)
        try:
            return await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProtocolError("an answer's status line and headers over 64 KiB") from None

    async def _open(self) -> asyncio.StreamReader:
        self._drop()
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self.opened += 1
        return self._reader

    def _drop(self) -> None:
        """Abort the connection (if open) without waiting: what it held is of no use."""
        if self._writer is not None:
            self._writer.transport.abort()
        self._reader = self._writer = None
