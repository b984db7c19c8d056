"""What clients send that no route can serve, against a real server over real sockets:
invalid Unicode, numbers and nesting past their limits, tokens a task cannot read, a
client that disconnects mid-body, slow headers, and requests whose time runs out while
they decode. Each gets a 4xx naming the field (or is closed), never a 500."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from servers import reference, running, served_copy

from seqtrans.decoding.generate import decoding_model
from seqtrans.inference.loading import Loaded
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.validation import MAX_DEPTH, check, read


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return served_copy(tmp_path_factory.mktemp("hardening"))


@pytest.fixture(scope="module")
def url(copy_model: Served) -> Iterator[str]:
    settings = ServeSettings(max_wait_ms=0, header_timeout_s=0.5, timeout_s=2)
    with running({"copy": copy_model}, settings) as url:
        yield url


JSON = {"Content-Type": "application/json"}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("route", "body", "status", "field"), [
    ("predict", b'{"inputs": ["A \\ud800"]}', 422, "inputs[0]"),
    ("predict", b'{"inputs": ["1", "2 \\udfff 3"]}', 422, "inputs[1]"),
    ("score", b'{"pairs": [["1 2", "\\ud800"]]}', 422, "pairs[0][1]"),
    ("predict", b'{"inputs": ["1"], "\\ud800": 1}', 422, "\\ud800"),
    ("predict", b'{"inputs": ' + DEEP + b"}", 422, None),
    ("score", DEEP, 422, None),
    ("predict", b'{"inputs": ["1"], "inputs": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", 422,
     "inputs" + "[0]" * (MAX_DEPTH - 1)),
    ("predict", b'{"inputs": ["1"], "beam": ' + b"7" * 5000 + b"}", 422, "beam"),
    ("predict", b'{"inputs": ["1"], "beam": 99999999999999999999}', 422, "beam"),
    ("predict", b'{"inputs": ["1"], "nbest": -' + b"1" * 30 + b"}", 422, "nbest"),
    ("predict", b'{"inputs": ["1"], "alpha": 1e308}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": 1e400}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": -1e400}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": NaN}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": Infinity}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": -Infinity}', 422, "alpha"),
    ("predict", b'{"inputs": ["1"], "alpha": 5.5}', 422, "alpha"),
    ("score", b'{"pairs": [["1", "2"]], "x": NaN}', 422, "x"),
    ("predict", b'{"inputs": ["1", 2]}', 422, "inputs[1]"),
    ("score", b'{"pairs": [["1", "2"], ["1"]]}', 422, "pairs[1]"),
])
def test_values_no_route_takes_get_a_422_naming_the_field(url: str, route: str, body: bytes, status: int,
                                                          field: str | None) -> None:
    answer = httpx.post(f"{url}/v1/models/copy/{route}", content=body, headers=JSON, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error.get("field") == field and error["message"] and "Traceback" not in answer.text
    if field is not None:
        assert error["message"].startswith(field) or f"'{field}'" in error["message"]
    assert answer.text.isascii()


def test_a_token_the_task_cannot_read_is_an_unknown_symbol_or_a_422_never_a_500(
        url: str, copy_model: Served, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    answer = httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": ["3 ² 4"]})
    assert answer.status_code == 200 and answer.json()["outputs"] == [reference(copy_model.loaded, "3 ² 4")]
    assert httpx.post(f"{url}/v1/models/copy/score", json={"pairs": [["3 ² 4", "3 ² 4"]]}).status_code == 200

    def broken(text: str) -> Any:  # a third-party task's reader failing outside its contract
        raise RuntimeError("cannot encode")

    monkeypatch.setattr(copy_model.loaded.task, "parse_source", broken)
    with caplog.at_level(logging.WARNING, logger="seqtrans.serving.requests"):
        for route, body, field in [("predict", {"inputs": ["1", "2"]}, "inputs[0]"),
                                   ("score", {"pairs": [["1", "2"]]}, "pairs[0][0]")]:
            answer = httpx.post(f"{url}/v1/models/copy/{route}", json=body)
            assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid_input"
            assert answer.json()["error"]["field"] == field and "RuntimeError" in answer.text
    assert "task copy failed on inputs[0]" in caplog.text  # kept for the task's author


def test_validation_takes_any_depth_without_recursion() -> None:
    nested: Any = "\ud800"
    for _ in range(50_000):
        nested = [nested]
    with pytest.raises(Exception, match="nested more than") as refused:
        check(nested)
    assert getattr(refused.value, "field", None) == "[0]" * MAX_DEPTH
    body = {"inputs": ["1 2"], "alpha": 0.5, "beam": 3}
    assert read(b'{"inputs": ["1 2"], "alpha": 0.5, "beam": 3}') == body


def _closed_within(sockets: list[socket.socket], seconds: float) -> tuple[list[float | None], list[bytes]]:
    """Trickle a header byte to each socket every 50 ms for ``seconds``: when each was
    closed by the server (seconds from now; None if still open) and what it answered."""
    started = time.monotonic()
    closed: list[float | None] = [None] * len(sockets)
    answers = [b""] * len(sockets)
    for s in sockets:
        s.setblocking(False)
    while time.monotonic() - started < seconds and None in closed:
        for i, s in enumerate(sockets):
            if closed[i] is not None:
                continue
            try:
                while data := s.recv(4096):
                    answers[i] += data
                closed[i] = time.monotonic() - started  # an empty read: the server closed it
                continue
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - started
                continue
            try:
                s.send(b"x")
            except BlockingIOError:
                pass
            except OSError:
                closed[i] = time.monotonic() - started
        time.sleep(0.05)
    return closed, answers


def test_connections_whose_headers_come_slowly_are_closed_after_the_header_timeout(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    slow = [socket.create_connection((host, int(port))) for _ in range(20)]
    try:
        for s in slow:  # slowloris: a request line, then header bytes that never end
            s.sendall(b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        # on a kept-alive connection, the next request's headers have the same time limit
        with httpx.Client() as client:
            assert client.post(f"{url}/v1/models/copy/predict", json={"inputs": ["1"]}).status_code == 200
        kept = socket.create_connection((host, int(port)))
        kept.sendall(b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n"
                     b'Content-Type: application/json\r\n\r\n{"inputs": ["1"]}')
        kept.settimeout(10)
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")  # answered, and kept alive
        kept.sendall(b"GET /health HTTP/1.1\r\nHo")
        closed, answers = _closed_within([*slow, kept], 5)
    finally:
        for s in slow:
            s.close()
    assert all(t is not None and t < 2.5 for t in closed), closed  # header_timeout_s is 0.5
    assert all(a.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in a for a in answers[:-1]), answers
    assert httpx.get(f"{url}/health").status_code == 200  # and the server goes on
    with socket.create_connection((host, int(port))) as idle:  # kept alive, and then silent
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.settimeout(10)
        answer = idle.recv(4096)
        while not answer.endswith(b'{"status":"alive"}'):
            answer += idle.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        assert idle.recv(4096) == b""  # closed at the timeout, with no answer to a request never sent


def test_a_body_that_comes_slowly_is_refused_at_the_request_time_limit(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/models/copy/score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                  b"Content-Type: application/json\r\n\r\n{")
        s.settimeout(10)
        started = time.monotonic()
        answer = s.recv(4096)
        assert 1.5 < time.monotonic() - started < 5  # timeout_s is 2, from the headers' arrival
        while not answer.endswith(b"}}") and (more := s.recv(4096)):
            answer += more
    assert answer.startswith(b"HTTP/1.1 408") and b'"limit": "timeout_s"' in answer


def test_a_client_that_disconnects_mid_body_is_a_499_without_a_traceback(url: str) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "seqtrans")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        before = _count(url, "499")
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                      b"Content-Type: application/json\r\n\r\n"
                      b'{"inputs": ["1 2')
            time.sleep(0.2)  # the server is reading the body
        deadline = time.monotonic() + 10
        while _count(url, "499") == before:
            assert time.monotonic() < deadline, "the disconnect was not counted"
            time.sleep(0.02)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert _count(url, "500") == 0
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], records


def _count(url: str, status: str) -> float:
    """Predict requests answered with ``status``, by the metrics."""
    labels = f'route="/v1/models/{{name}}/predict",status="{status}"'
    line = re.search(rf"^seqtrans_requests_total{{{labels}}} (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    return float(line.group(1)) if line else 0.0


class Steps:
    """Counts the decoding steps the model takes (a forward hook on the target embedding
    of the model and of the copy decoding uses), each slowed by ``delay`` seconds so
    that a decoding outlasts a short time limit; and the hypotheses each step decodes."""

    def __init__(self, loaded: Loaded, delay: float) -> None:
        self.rows: list[int] = []
        self.delay = delay
        models = {id(m): m for m in (loaded.model, decoding_model(loaded.model, "fp32", loaded.device))}
        self.handles = [m.target_embed.register_forward_hook(self._step) for m in models.values()]

    def _step(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if args[0].size(1) == 1:  # [N, 1]: a decoding step (the encoder reads whole sources)
            self.rows.append(args[0].size(0))
            time.sleep(self.delay)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


LONG = ["1 2 3 4 5 6 7 8 9", "9 8 7 6 5 4 3 2 1", "5 5 5 5 5", "2 4 6 8"]  # 15 steps untrained


def test_a_request_past_its_deadline_stops_decoding_at_the_next_step(copy_model: Served) -> None:
    steps = Steps(copy_model.loaded, delay=0.0)
    try:
        copy_model.loaded.decode([copy_model.loaded.task.parse_source(t) for t in LONG])
        whole = len(steps.rows)
        with running({"copy": copy_model}, ServeSettings(max_wait_ms=0, timeout_s=0.6)) as url:
            steps.rows.clear()
            steps.delay = 0.1  # decoding all of it now takes more than twice the limit
            assert whole * steps.delay > 1.2
            answer = httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": LONG}, timeout=30)
            at_answer = len(steps.rows)
            assert answer.status_code == 504 and answer.json()["error"]["limit"] == "timeout_s"
            time.sleep(0.5)  # long enough for five more steps
            assert len(steps.rows) - at_answer <= 1, steps.rows  # at most the step under way went on
            assert 0 < len(steps.rows) < whole
            assert re.search(r"^seqtrans_expired_inputs_total 4\.0$", httpx.get(f"{url}/metrics").text, re.M)
            steps.delay = 0.0
            again = httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": ["1 2"]}, timeout=30)
            assert again.status_code == 200  # the decoding thread is free at once
    finally:
        steps.remove()


def test_a_request_that_goes_away_leaves_its_batch_and_the_others_get_their_outputs(
        copy_model: Served) -> None:
    steps = Steps(copy_model.loaded, delay=0.0)
    try:
        with running({"copy": copy_model}, ServeSettings(max_wait_ms=500)) as url:
            steps.rows.clear()
            steps.delay = 0.05  # the batch decodes from 0.5 s to about 1.25 s
            kept: list[httpx.Response] = []
            other = threading.Thread(target=lambda: kept.append(httpx.post(
                f"{url}/v1/models/copy/predict", json={"inputs": LONG[:1], "beam": 1}, timeout=30)))
            other.start()
            while not re.search(r"^seqtrans_queued_requests 1", httpx.get(f"{url}/metrics").text, re.M):
                time.sleep(0.01)
            with pytest.raises(httpx.ReadTimeout):  # gives up mid-batch and closes its connection
                httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": LONG[1:], "beam": 1}, timeout=0.9)
            other.join(30)
            metrics = httpx.get(f"{url}/metrics").text
    finally:
        steps.remove()
    assert steps.rows[0] == len(LONG)  # decoded together
    assert steps.rows[-1] == 1 and len(steps.rows) == 15  # the kept input decoded to its end alone
    assert re.search(r"^seqtrans_expired_inputs_total 3\.0$", metrics, re.M)
    assert kept[0].status_code == 200
    assert kept[0].json()["outputs"] == [reference(copy_model.loaded, LONG[0], beam=1)]


def test_a_request_that_can_finish_in_time_succeeds_behind_one_that_timed_out(copy_model: Served) -> None:
    """Each decoding step takes 0.1 s and more. The first request needs over 10 s (105
    steps) and times out at 2 s; the second arrives then, needs 7 steps and has until
    4 s: it gets its output only if the first one's decoding stopped at its 504."""
    steps = Steps(copy_model.loaded, delay=0.0)
    endless = " ".join(str(i % 30) for i in range(100))
    try:
        with running({"copy": copy_model}, ServeSettings(max_wait_ms=0, timeout_s=2.0)) as url:
            steps.delay = 0.1
            answers: dict[str, httpx.Response] = {}
            first = threading.Thread(target=lambda: answers.update(first=httpx.post(
                f"{url}/v1/models/copy/predict", json={"inputs": [endless], "beam": 1}, timeout=30)))
            first.start()
            time.sleep(2.0)
            answers["second"] = httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": ["1"], "beam": 1},
                                           timeout=30)
            first.join(30)
    finally:
        steps.remove()
    assert answers["first"].status_code == 504
    assert answers["second"].status_code == 200, answers["second"].text
    assert answers["second"].json()["outputs"] == [reference(copy_model.loaded, "1", beam=1)]
    assert len(steps.rows) < 40  # the first stopped after about 20 steps, not 105
