"""The OpenAPI description against what the server really takes and answers: a body is
valid by the served schema exactly when the request checks take it, the fields the
checks read are the schema's, and real answers (HTTP and WebSocket, outputs and errors)
are valid by the schemas of their routes and messages (``schemas.py``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fuzzing import from_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemas import is_valid, problems, validate
from servers import running
from test_inference import copy_run
from websockets.sync.client import connect

from seqtrans.inference.loading import load
from seqtrans.serving import requests, validation
from seqtrans.serving.errors import CODES, RequestError
from seqtrans.serving.fields import Message
from seqtrans.serving.models import Served
from seqtrans.serving.openapi import schema
from seqtrans.serving.settings import ServeSettings

DESCRIPTION = schema()
#: Settings whose limits no drawn body reaches: what they bound is a server's choice, not the schema's.
WIDE = ServeSettings(max_inputs=10**6, max_beam=validation.MAX_INTEGER)
ANY = st.recursive(st.none() | st.booleans() | st.integers(-5, 10) | st.floats(-10, 10) | st.text(max_size=5),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=3), max_leaves=8)


def _body(route: str) -> dict[str, Any]:
    post = DESCRIPTION["paths"][f"/v1/models/{{name}}/{route}"]["post"]
    return dict(post["requestBody"]["content"]["application/json"]["schema"])


KINDS = {"predict": (requests.PREDICT, _body("predict")), "score": (requests.SCORE, _body("score")),
         "stream": (requests.STREAM_MESSAGE, DESCRIPTION["components"]["schemas"]["StreamMessage"])}


def _bodies(body_schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Bodies the schema allows, those with one field replaced (a known one or not), and any JSON."""
    valid = from_schema(body_schema)
    names = st.sampled_from(list(body_schema["properties"])) | st.text(max_size=6)
    replaced = st.tuples(valid, names, ANY).map(lambda v: {**v[0], v[1]: v[2]})
    dropped = st.tuples(valid, names).map(lambda v: {k: x for k, x in v[0].items() if k != v[1]})
    return valid | replaced | dropped | ANY


def _integral_float(value: Any) -> bool:
    """JSON Schema counts 2.0 as an integer; the server, like Python's json, reads it as a float."""
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    if isinstance(value, list):
        return any(_integral_float(v) for v in value)
    return isinstance(value, dict) and any(_integral_float(v) for v in value.values())


def _taken(kind: Message, body: Any) -> bool:
    try:
        kind.read(body, WIDE)
    except RequestError as exc:
        assert exc.code in (kind.code, "invalid_request"), exc.body()
        return False
    return True


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_body_is_valid_by_the_schema_exactly_when_the_checks_take_it(name: str) -> None:
    kind, body_schema = KINDS[name]
    seen = {True: 0, False: 0}

    @settings(max_examples=400, suppress_health_check=list(HealthCheck), deadline=None)
    @given(_bodies(body_schema))
    def agree(body: Any) -> None:
        try:
            validation.check(body)  # what reaches the checks: valid text, finite numbers
        except RequestError:
            return
        if _integral_float(body):
            return
        valid = is_valid(body, body_schema)
        assert _taken(kind, body) == valid, body
        seen[valid] += 1

    agree()
    assert seen[True] > 20 and seen[False] > 20, seen  # both sides were reached


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_checks_refuse_every_field_the_schema_lacks(name: str) -> None:
    kind, body_schema = KINDS[name]
    declared = set(body_schema["properties"])
    assert declared == {f.name for f in kind.fields}
    for unknown in ("run_dir", "Beam", "input", "pair", "word", "ends", "model"):
        assert unknown not in declared
        with pytest.raises(RequestError) as refused:
            kind.read({unknown: 1}, WIDE)
        assert refused.value.field == unknown


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """A copy model that streams (wait-k over a causal encoder) and decodes requests."""
    run = copy_run(tmp_path_factory.mktemp("schema") / "waitk", seed=2,
                   model=("model.causal_encoder=true", "decode.wait_k=2"))
    return Served("waitk", load(run, device="cpu"))


def test_every_predict_field_the_schema_names_is_read(served: Served) -> None:
    """Each field changes the checked request, or is refused by name: none is ignored."""
    base = requests.parse_predict(served, {"inputs": ["1 2"]}, WIDE)
    values = {"beam": 2, "nbest": 2, "alpha": 1.5, "length_penalty": "power", "precision": "int8",
              "scores": True, "attention": True, "source_lang": "xx", "target_lang": "xx"}
    assert set(values) | {"inputs"} == set(KINDS["predict"][1]["properties"])
    for name, value in values.items():
        body = {"inputs": ["1 2"], name: value, **({"beam": 2} if name == "nbest" else {})}
        try:
            checked = requests.parse_predict(served, body, WIDE)
        except RequestError as exc:
            assert exc.field == name and name.endswith("_lang"), exc.body()  # copy has no languages
            continue
        assert checked != base and (getattr(checked.decode, name, None) == value
                                    or getattr(checked, name, None) == value), name
    other = requests.parse_predict(served, {"inputs": ["1 2", "3"]}, WIDE)
    assert len(other.sources) == 2 and other.tokens > base.tokens


@pytest.fixture(scope="module")
def url(served: Served) -> Iterator[str]:
    with running({"waitk": served}, ServeSettings(max_inputs=4, max_input_tokens=8, max_beam=4)) as url:
        yield url


def _answer_schema(path: str, method: str, status: int) -> dict[str, Any]:
    response = DESCRIPTION["paths"][path][method]["responses"][str(status)]
    return dict(response["content"]["application/json"]["schema"])


def _valid(answer: httpx.Response, path: str, method: str = "get") -> None:
    validate(answer.json(), _answer_schema(path, method, answer.status_code))
    if answer.status_code >= 400:
        assert CODES[answer.json()["error"]["code"]].status == answer.status_code


PREDICT = "/v1/models/{name}/predict"


@pytest.mark.parametrize("body", [
    {"inputs": ["1 2 3", "4"]}, {"inputs": ["1 2"], "beam": 3, "nbest": 2},
    {"inputs": ["5 6"], "scores": True, "attention": True, "alpha": 0}, {"inputs": ["1"], "beam": None},
    {"inputs": []}, {"inputs": ["1"], "beam": 9}, {"inputs": ["1"] * 5}, {"inputs": ["1 " * 20]},
    {"inputs": ["1"], "beam": 2, "nbest": 3}, {"inputs": ["1"], "words": "2"}, ["1"]])
def test_real_predict_answers_are_valid_by_the_schema(url: str, body: Any) -> None:
    answer = httpx.post(f"{url}/v1/models/waitk/predict", json=body, timeout=30)
    _valid(answer, PREDICT, "post")


def test_real_answers_of_the_other_routes_are_valid_by_the_schema(url: str) -> None:
    score = "/v1/models/{name}/score"
    pairs = [["1 2", "1 2"], ["3", ""]]
    _valid(httpx.post(f"{url}/v1/models/waitk/score", json={"pairs": pairs}), score, "post")
    _valid(httpx.post(f"{url}/v1/models/waitk/score", json={"pairs": [["1"]]}), score, "post")
    _valid(httpx.post(f"{url}/v1/models/nope/predict", json={"inputs": ["1"]}), PREDICT, "post")
    json_type = {"Content-Type": "application/json"}
    _valid(httpx.post(f"{url}/v1/models/waitk/predict", content=b"{", headers=json_type), PREDICT, "post")
    _valid(httpx.post(f"{url}/v1/models/waitk/predict", content=b'{"inputs": ["1"]}'), PREDICT, "post")
    _valid(httpx.get(f"{url}/v1/models"), "/v1/models")
    _valid(httpx.get(f"{url}/v1/models/waitk"), "/v1/models/{name}")
    _valid(httpx.get(f"{url}/v1/models/nope"), "/v1/models/{name}")
    _valid(httpx.get(f"{url}/health"), "/health")
    _valid(httpx.get(f"{url}/ready"), "/ready")


def _message(name: str) -> dict[str, Any]:
    return dict(DESCRIPTION["components"]["schemas"][name])


def test_real_stream_messages_are_valid_by_the_schema(url: str) -> None:
    kinds = {"token": _message("StreamToken"), "word": _message("StreamWord"), "done": _message("StreamDone"),
             "error": _message("Error")}
    sent = [{"words": "1 2"}, {"words": "3", "end": False}, {"words": None}, {"end": True}, {"end": True},
            {"words": "4 5 6"}, {"end": 1}]
    assert all(is_valid(m, _message("StreamMessage")) for m in sent[:-1])
    assert not is_valid(sent[-1], _message("StreamMessage"))
    received: list[dict[str, Any]] = []
    with connect(url.replace("http://", "ws://") + "/v1/models/waitk/stream") as ws:
        for message in sent:
            ws.send(json.dumps(message))
        while "error" not in (received[-1] if received else {}):
            received.append(json.loads(ws.recv(timeout=30)))
    assert {next(iter(m)) for m in received} == set(kinds)  # each kind came
    for message in received:
        validate(message, kinds[next(iter(message))])
    assert received[-1]["error"]["field"] == "end"


@pytest.mark.parametrize("message", ["null", "3", '"end"', "{}"])
def test_a_message_that_is_no_object_is_refused_and_the_connection_closes(url: str, message: str) -> None:
    with connect(url.replace("http://", "ws://") + "/v1/models/waitk/stream") as ws:
        ws.send(message)
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "invalid_message"


def test_the_validation_follows_json_schema() -> None:
    number = {"type": ["integer", "null"], "minimum": 1}
    values = (1, 2.0, None, 0, 1.5, True, "1")
    assert [is_valid(v, number) for v in values] == [True, True, True] + [False] * 4
    closed = {"type": "object", "properties": {"a": {"enum": ["x", None]}}, "required": ["a"],
              "additionalProperties": False, "minProperties": 1}
    assert is_valid({"a": None}, closed) and not is_valid({"a": "y"}, closed) and not is_valid({}, closed)
    assert problems({"a": "x", "b": 1}, closed) == ["$: unknown 'b'"]
    pair = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}
    assert is_valid(["a", "b"], pair) and not is_valid(["a"], pair) and not is_valid(["a", 1], pair)
    with pytest.raises(ValueError, match="pattern"):
        is_valid("a", {"type": "string", "pattern": "b"})


def test_the_description_is_the_one_served(url: str, tmp_path: Path) -> None:
    assert httpx.get(f"{url}/openapi.json").json() == json.loads(json.dumps(DESCRIPTION))
