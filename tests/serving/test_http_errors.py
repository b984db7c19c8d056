"""Against a real server over real sockets: bodies a web page on another site could send
without a CORS preflight (text/plain, forms) are refused with 415, requests h11 cannot
parse get a JSON 400 rather than uvicorn's plain text, and names a client sends are cut
short when an error echoes them."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from servers import reference, running, served_copy

from seqtrans.serving.errors import ECHOED
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings

BODY = b'{"inputs": ["1 2"]}'


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return served_copy(tmp_path_factory.mktemp("http_errors"))


@pytest.fixture(scope="module")
def url(copy_model: Served) -> Iterator[str]:
    with running({"copy": copy_model}, ServeSettings(max_wait_ms=0)) as url:
        yield url


@pytest.mark.parametrize("route", ["predict", "score"])
@pytest.mark.parametrize("content_type", [
    None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/jsonp", "application/json-seq", "json"])
def test_a_body_not_declared_json_is_refused_with_415(url: str, route: str, content_type: str | None) -> None:
    body = BODY if route == "predict" else b'{"pairs": [["1", "1"]]}'
    headers = {} if content_type is None else {"Content-Type": content_type}
    answer = httpx.post(f"{url}/v1/models/copy/{route}", content=body, headers=headers)
    assert answer.status_code == 415, answer.text
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/json ;charset=UTF-8"])
def test_a_body_declared_json_is_read(url: str, copy_model: Served, content_type: str) -> None:
    answer = httpx.post(f"{url}/v1/models/copy/predict", content=BODY, headers={"Content-Type": content_type})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [reference(copy_model.loaded, "1 2")]


def test_a_preflight_is_refused_without_cors_headers(url: str) -> None:
    answer = httpx.options(f"{url}/v1/models/copy/predict", headers={
        "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
    assert not any(h.lower().startswith("access-control-") for h in answer.headers)


def _raw(url: str, request: bytes) -> bytes:
    """What the server answers to ``request`` on a fresh connection, until it closes it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while data := s.recv(65536):
            answer += data
    return answer


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: -5\r\n\r\n" + BODY,
    b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"GET /health HTTP/1.1\r\n\r\n",  # no Host
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000,  # headers past h11's 16 KiB
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS hello
    b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"GET /health\x00 HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_a_request_the_http_parser_refuses_gets_a_json_400(url: str, request_bytes: bytes) -> None:
    answer = _raw(url, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"content-type: application/json" in head.lower()
    error = httpx.Response(400, content=body).json()["error"]
    assert error["code"] == "bad_request" and error["message"]
    assert httpx.get(f"{url}/health").status_code == 200  # and the server goes on


def test_a_long_model_name_is_cut_short_in_the_404(url: str) -> None:
    name = "m" * 10_000  # a request line within h11's 16 KiB: it reaches the app
    for answer in (httpx.post(f"{url}/v1/models/{name}/predict", json={"inputs": ["1"]}),
                   httpx.get(f"{url}/v1/models/{name}")):
        assert answer.status_code == 404
        message = answer.json()["error"]["message"]
        assert "m" * ECHOED in message and "m" * (ECHOED + 1) not in message and len(message) < 2 * ECHOED
    # 100 KB: h11 takes it when it arrives in one read (a 404 as above), else refuses it (400)
    head, _, body = _raw(url, b"GET /v1/models/" + b"m" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\n\r\n").partition(b"\r\n\r\n")
    assert head.split(b" ")[1] in (b"400", b"404") and len(body) < 3 * ECHOED
    assert httpx.Response(400, content=body).json()["error"]["message"]


@pytest.mark.parametrize("body", [
    b'{"inputs": ["1"], "' + b"k" * 100_000 + b'": 1}',  # an unknown field
    b'{"inputs": ["1"], "' + b"k" * 100_000 + b'": NaN}',  # a value no route takes, under a long key
])
def test_a_long_field_name_is_cut_short_in_the_error(url: str, body: bytes) -> None:
    answer = httpx.post(f"{url}/v1/models/copy/predict", content=body,
                        headers={"Content-Type": "application/json"})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert len(error["field"]) <= ECHOED + 3 and len(error["message"]) < 3 * ECHOED


UPGRADE = b"GET /v1/models/copy/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"


@pytest.mark.parametrize(("request_bytes", "status", "code"), [
    (UPGRADE + b"\r\n", 400, "bad_request"),  # no Sec-WebSocket-Key
    (UPGRADE + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 99\r\n\r\n", 400,
     "bad_request"),
    (UPGRADE + b"Sec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n\r\n", 400, "bad_request")])
def test_a_websocket_handshake_the_library_refuses_gets_a_json_error(url: str, request_bytes: bytes,
                                                                     status: int, code: str) -> None:
    head, _, body = _raw(url, request_bytes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), head
    assert b"content-type: application/json" in head.lower()
    error = httpx.Response(status, content=body).json()["error"]
    assert error["code"] == code and "Sec-WebSocket" in error["message"]


def test_a_websocket_refused_for_its_token_gets_a_json_403(copy_model: Served) -> None:
    with running({"copy": copy_model}, token="s3cret") as url:
        head, _, body = _raw(url, UPGRADE + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                             b"Sec-WebSocket-Version: 13\r\n\r\n").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403") and b"content-type: application/json" in head.lower()
    assert httpx.Response(403, content=body).json()["error"]["code"] == "forbidden"
