"""What clients send that no route can serve, against a real server over real sockets:
invalid Unicode, numbers and nesting past their limits, tokens a task cannot read, a
client that disconnects mid-body, slow headers, and requests whose time runs out while
they decode. Each gets a 4xx naming the field (or is closed), never a 500."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servers import reference, running
from test_inference import copy_run

from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.validation import MAX_DEPTH, check, read


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Served:
    run = copy_run(tmp_path_factory.mktemp("hardening") / "copy", seed=3, vocab_size=30)
    return Served("copy", load(run, device="cpu"))


@pytest.fixture(scope="module")
def url(copy_model: Served) -> Iterator[str]:
    with running({"copy": copy_model}, ServeSettings(max_wait_ms=0)) as url:
        yield url


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
    answer = httpx.post(f"{url}/v1/models/copy/{route}", content=body, timeout=30)
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
    with caplog.at_level(logging.WARNING, logger="seqtrans.serving.models"):
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
