"""The load benchmarks' HTTP client: answers equal to httpx's from a real ``seqtrans serve``
process (outputs, refusals, a full queue's 503), connections the server closes opened
again, and answers framed in ways it does not read refused, against servers written here
byte by byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from servers import reference, serve_process
from test_inference import copy_run

from benchmarks.http_client import ERRORS, Answer, Connection, ProtocolError, parse_head, request
from benchmarks.serve_load import load_test
from seqtrans.inference.loading import load

TEXTS = ["1 2 3", "4 5", "6 7 8 9 1"]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# ------------------------------------------------------------------ against seqtrans serve


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tmp_path_factory.mktemp("client") / "copy", seed=3, vocab_size=30)


@pytest.fixture(scope="module")
def url(run: Path) -> Iterator[str]:
    # a queue of 2 whose batch waits a second: of 6 requests sent at once, 4 are refused
    with serve_process(f"m={run}", "--device", "cpu", "--max-queue", "2", "--max-wait-ms", "1000") as served:
        yield served[0]


def _exchanges(url: str) -> list[tuple[str, str, bytes | None, str]]:
    """Requests of every kind the load benchmarks make or meet: (method, URL, body, type)."""
    predict = f"{url}/v1/models/m/predict"
    nbest = {"inputs": TEXTS[1:], "beam": 3, "nbest": 2, "scores": True}
    return [("POST", predict, json.dumps({"inputs": [TEXTS[0]], "beam": 2}).encode(), "application/json"),
            ("POST", predict, json.dumps(nbest).encode(), "application/json"),
            ("POST", f"{url}/v1/models/nosuchmodel/predict", b'{"inputs": ["1"]}', "application/json"),
            ("POST", predict, b'{"inputs": ["1"', "application/json"),  # not JSON
            ("POST", predict, b'{"inputs": ["1"], "beem": 2}', "application/json"),  # an unknown field
            ("POST", predict, b'{"inputs": ["1"]}', "text/plain"),
            ("GET", predict, None, ""),
            ("GET", f"{url}/v1/models", None, ""),
            ("GET", f"{url}/health", None, "")]


def test_answers_equal_httpx_answers_on_one_kept_connection(url: str) -> None:
    exchanges = _exchanges(url)
    with httpx.Client(timeout=60) as client:
        expected = [client.request(method, target, content=body,
                                   headers={"content-type": kind} if body else {})
                    for method, target, body, kind in exchanges]
    assert [a.status_code for a in expected] == [200, 200, 404, 400, 422, 415, 405, 200, 200]

    async def send() -> tuple[list[Answer], int]:
        async with Connection(url) as connection:
            answers = [await connection.send(request(method, target, body=body, content_type=kind))
                       for method, target, body, kind in exchanges]
            return answers, connection.opened

    answers, opened = asyncio.run(send())
    assert opened == 1  # refusals keep the connection too
    for theirs, ours in zip(expected, answers):
        assert ours.status == theirs.status_code
        assert ours.headers["content-type"] == theirs.headers["content-type"]
        assert ours.json() == theirs.json()
    assert answers[1].json()["outputs"][1]["hypotheses"][1]["score"] < 0  # n-best lists with scores came


def test_a_full_queue_answers_503_and_the_load_test_counts_refusals_and_wrong_outputs(url: str, run: Path,
                                                                                       ) -> None:
    predict = f"{url}/v1/models/m/predict"

    async def at_once() -> list[Answer]:
        sends = [request("POST", predict, body=json.dumps({"inputs": [TEXTS[i % 3]], "beam": 4}).encode())
                 for i in range(6)]
        async with contextlib.AsyncExitStack() as stack:
            connections = [await stack.enter_async_context(Connection(url)) for _ in sends]
            return await asyncio.gather(*(c.send(s) for c, s in zip(connections, sends)))

    answers = asyncio.run(at_once())
    assert sorted(a.status for a in answers) == [200, 200, 503, 503, 503, 503]
    for answer in answers:
        if answer.status == 503:
            assert answer.headers["retry-after"] == "1" and answer.json()["error"]["limit"] == "max_queue"
    loaded = load(run, device="cpu")
    outputs = [reference(loaded, text, beam=4)["output"] for text in TEXTS]  # as serve_load compares
    row = asyncio.run(load_test(url, TEXTS, outputs, users=6, requests=6, beam=4))
    assert (row["ok"], row["refused"], row["errors"], row["wrong_outputs"]) == (2, 4, 0, 0)
    assert row["statuses"] == {"200": 2, "503": 4} and row["connections_opened"] == 6
    # two users never fill a queue of 2; the second sentence's one request is now "wrong"
    wrong = [outputs[0], outputs[1] + " and more", outputs[2]]
    row = asyncio.run(load_test(url, TEXTS, wrong, users=2, requests=4, beam=4))
    assert (row["ok"], row["refused"], row["errors"], row["wrong_outputs"]) == (4, 0, 0, 1)
    assert row["connections_opened"] == 2


def test_a_connection_the_server_closes_is_opened_again(url: str) -> None:
    async def send() -> tuple[list[Answer], int]:
        async with Connection(url) as connection:
            closing = request("GET", f"{url}/health", headers={"Connection": "close"})
            answers = [await connection.send(closing)]
            answers.append(await connection.send(request("GET", f"{url}/v1/models")))
            assert connection.opened == 2  # the server closed the first as asked
            await asyncio.sleep(5.5)  # past uvicorn's timeout_keep_alive (5 s): closed while idle
            answers.append(await connection.send(request("GET", f"{url}/health")))
            return answers, connection.opened

    answers, opened = asyncio.run(send())
    assert answers[0].headers["connection"] == "close"
    assert [a.status for a in answers] == [200, 200, 200] and opened == 3
    assert answers[1].json() == httpx.get(f"{url}/v1/models").json()


# --------------------------------------------------------- against servers written here


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """The URL of a server on a free port answering each connection with ``handler``, and
    a list that counts its connections (one entry each)."""
    connections: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:  # a client that went away ends its connection's handler
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """A request's head and body (of its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = [int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")]
    return head + await reader.readexactly(length[0] if length else 0)


def answer(body: bytes, *headers: str) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + "".join(f"{h}\r\n" for h in headers).encode() + b"\r\n" + body


def run_against(handler: Handler, *bodies: bytes, timeout: float = 10.0) -> tuple[list[Answer | str], int]:
    """Send a request per body, one after another on one :class:`Connection`: the answers
    (an error's class name where it raised) and how many connections the server saw."""

    async def go() -> tuple[list[Answer | str], int]:
        out: list[Answer | str] = []
        async with serving(handler) as (url, connections):
            async with Connection(url, timeout=timeout) as connection:
                for body in bodies:
                    try:
                        out.append(await connection.send(request("POST", f"{url}/x", body=body)))
                    except ERRORS as exc:
                        out.append(type(exc).__name__)
            return out, len(connections)

    return asyncio.run(go())


def _echo(kept: int, *headers: str) -> Handler:
    """A handler answering every request of a connection with its body, with ``headers``,
    then closing after ``kept`` answers (0: never)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while not reader.at_eof():
            try:
                body = (await read_request(reader)).split(b"\r\n\r\n", 1)[1]
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(body, f"Content-Length: {len(body)}", *headers))
            answered += 1
            if answered == kept:
                await writer.drain()
                return

    return handle


def test_a_server_that_closes_after_each_answer_without_saying_so_gets_a_new_connection_each_time() -> None:
    answers, connections = run_against(_echo(1), b"a", b"bb", b"ccc")
    assert [a.body for a in answers if isinstance(a, Answer)] == [b"a", b"bb", b"ccc"]
    assert connections == 3


def test_connection_close_is_honoured_and_keep_alive_kept() -> None:
    answers, connections = run_against(_echo(0, "Connection: close"), b"a", b"b")
    assert [a.body for a in answers if isinstance(a, Answer)] == [b"a", b"b"] and connections == 2
    answers, connections = run_against(_echo(0), b"a", b"b", b"c")
    assert [a.body for a in answers if isinstance(a, Answer)] == [b"a", b"b", b"c"] and connections == 1


def test_a_request_crossing_the_servers_close_of_an_idle_connection_is_sent_again_once() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if handled:
            await _echo(0)(reader, writer)
            return
        handled.append(1)
        first = (await read_request(reader)).split(b"\r\n\r\n", 1)[1]
        writer.write(answer(first, f"Content-Length: {len(first)}"))
        await read_request(reader)  # the next request arrives as the server closes: never answered

    handled: list[int] = []
    answers, connections = run_against(handle, b"a", b"b")
    assert [a.body for a in answers if isinstance(a, Answer)] == [b"a", b"b"] and connections == 2


def test_a_new_connection_closed_without_an_answer_is_an_error_not_a_retry() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    answers, connections = run_against(handle, b"a", b"b")
    assert answers == ["IncompleteReadError", "IncompleteReadError"] and connections == 2


def test_an_answer_cut_short_is_an_error_and_the_next_request_gets_a_new_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(seen) == 0:
            seen.append(await read_request(reader))
            writer.write(answer(b"abc", "Content-Length: 10"))  # 7 bytes short, then closed
            return
        await _echo(0)(reader, writer)

    seen: list[bytes] = []
    answers, connections = run_against(handle, b"a", b"b")
    assert answers[0] == "IncompleteReadError" and isinstance(answers[1], Answer) and answers[1].body == b"b"
    assert connections == 2


def test_a_body_without_a_length_is_read_to_the_connections_end() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"whole": "body"}', "Content-Type: application/json"))

    answers, connections = run_against(handle, b"a", b"b")
    assert [a.json() for a in answers if isinstance(a, Answer)] == [{"whole": "body"}] * 2
    assert connections == 2


def test_a_chunked_answer_is_refused_with_the_reason() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"3\r\nabc\r\n0\r\n\r\n", "Transfer-Encoding: chunked"))
        await reader.read()

    async def go() -> None:
        async with serving(handle) as (url, _), Connection(url, timeout=10) as connection:
            with pytest.raises(ProtocolError, match="Transfer-Encoding: chunked, which this client does not"):
                await connection.send(request("GET", url))

    asyncio.run(go())


def test_an_answer_not_in_time_is_an_error() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # never answers

    started = time.monotonic()
    answers, _ = run_against(handle, b"a", timeout=0.3)
    assert answers == ["TimeoutError"] and time.monotonic() - started < 5


def test_the_head_of_an_answer_is_read_as_http_says() -> None:
    assert parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n") == (
        404, {"content-length": "2", "x-a": "1, 2"}, True)
    assert parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\n\r\n")[2] is False
    assert parse_head(b"HTTP/1.0 200 OK\r\n\r\n")[2] is False
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n")[2] is True
    for bad in (b"HTTP/2 200 OK\r\n\r\n", b"HTTP/1.1 2x0 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"):
        with pytest.raises(ProtocolError):
            parse_head(bad)


def test_request_bytes_declare_their_body_and_host() -> None:
    assert request("POST", "http://localhost:8000/v1/x?a=1", body=b"{}", headers={"Connection": "close"}) == (
        b"POST /v1/x?a=1 HTTP/1.1\r\nHost: localhost:8000\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert request("GET", "http://h") == b"GET / HTTP/1.1\r\nHost: h:80\r\n\r\n"
    with pytest.raises(ValueError, match="http://"):
        request("GET", "https://h/")
