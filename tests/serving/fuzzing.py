"""Requests drawn from the server's own OpenAPI description, and worse: the bodies its
schemas allow (:func:`from_schema`), those bodies with a field replaced by any JSON
value, any JSON value, JSON that Python's ``json`` reads badly (lone surrogates, NaN,
thousands of digits, deep nesting) and bytes that are not JSON, to every route the
description names, with model names that exist and names that do not. Used by
``test_fuzz.py`` and ``benchmarks/serve_fuzz.py``."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import strategies as st

#: (method, path, body or None) of one request.
Request = tuple[str, str, "bytes | None"]

_TEXT = st.text(max_size=12) | st.sampled_from(["", "1 2 3", "3 ² 4", "A \ud800", "\udfff", "9" * 40,
                                                "x y z"])
_NUMBERS = (st.integers(-(10**30), 10**30) | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([0, 1, -1, 2**63, 1e308, -0.0, 5.0, 5.000001]))
_JSON = st.recursive(st.none() | st.booleans() | _NUMBERS | _TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=12)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """The values a JSON schema allows, for the keywords the server's description uses
    (hypothesis-jsonschema would do this, but does not work with current hypothesis)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):  # one of several types (a nullable field: ["integer", "null"])
        return st.one_of([from_schema({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "object":
        properties = {k: from_schema(v) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        fixed = st.fixed_dictionaries({k: v for k, v in properties.items() if k in required},
                                      optional={k: v for k, v in properties.items() if k not in required})
        if schema.get("additionalProperties", True) is False:
            return fixed
        return st.tuples(fixed, st.dictionaries(_TEXT, _JSON, max_size=2)).map(lambda d: {**d[1], **d[0]})
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", schema.get("minItems", 0) + 5))
    if kind == "string":
        return _TEXT
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"),
                         allow_nan=False, allow_infinity=False)
    return _JSON


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN and Infinity as Python writes them


def _odd_json() -> st.SearchStrategy[bytes]:
    """JSON text that Python's ``json`` reads into values no route can hold, or not at all."""
    depth = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n)
    digits = st.integers(1, 6000).map(lambda n: b'{"inputs": ["1"], "beam": ' + b"7" * n + b"}")
    constant = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"]).map(
        lambda c: b'{"inputs": ["1 2"], "alpha": ' + c + b"}")
    surrogate = st.sampled_from([b'"\\ud800"', b'"a\\udfffb"', b'"\\ud800\\udc00"']).map(
        lambda s: b'{"inputs": [' + s + b"]}")
    return depth | digits | constant | surrogate | st.binary(max_size=40)


def requests(schema: dict[str, Any], models: list[str]) -> st.SearchStrategy[Request]:
    """Requests to every route of ``schema`` (the server's /openapi.json), to the
    ``models`` it serves and to names it does not."""
    served = st.sampled_from(models)
    names = served | _TEXT.filter(bool)
    drawn: list[st.SearchStrategy[Request]] = []
    for template, operations in schema["paths"].items():
        for method, operation in operations.items():
            if template.endswith("/stream"):
                continue  # a WebSocket: its messages are tried by test_stream.py
            content = operation.get("requestBody", {}).get("content", {})
            body = content.get("application/json", {}).get("schema")
            if body is None:
                drawn.append(st.tuples(st.just(method.upper()), _paths(template, names), st.none()))
                continue
            valid = from_schema(body)
            replaced = st.tuples(valid, _TEXT | st.sampled_from(list(body.get("properties", {}))), _JSON).map(
                lambda v: {**v[0], v[1]: v[2]} if isinstance(v[0], dict) else v[0])
            bodies = (valid.map(_dumps) | replaced.map(_dumps) | _JSON.map(_dumps) | _odd_json())
            # the routes that decode, most often, and mostly of models served
            drawn += [st.tuples(st.just(method.upper()), _paths(template, served), bodies)] * 4
            drawn.append(st.tuples(st.just(method.upper()), _paths(template, names), bodies))
    return st.one_of(drawn)


def _paths(template: str, names: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    if "{name}" not in template:
        return st.just(template)
    encoded = names.map(lambda n: quote(n.encode("utf-8", "surrogatepass"), safe=""))
    return encoded.map(lambda n: template.replace("{name}", n))


def send(client: httpx.Client, request: Request) -> httpx.Response:
    method, path, body = request
    headers = {"content-type": "application/json"} if body is not None else {}
    return client.request(method, path, content=body, headers=headers)


def problem(request: Request, answer: httpx.Response) -> str | None:
    """What is wrong with the server's ``answer`` to ``request``, or None: no 5xx; every
    refusal a JSON error with a code and a message; every answer to a JSON route JSON."""
    method, path, body = request
    where = f"{method} {path} {(body or b'')[:200]!r}: {answer.status_code} {answer.text[:300]}"
    if answer.status_code >= 500:
        return where
    if (path == "/metrics" and answer.status_code == 200) or 300 <= answer.status_code < 400:
        return None  # Prometheus text; a redirect (a name such as "/" makes a path ending in "//")
    try:
        content = answer.json()
    except ValueError:
        return f"not JSON: {where}"
    if answer.status_code >= 400:
        error = content.get("error") if isinstance(content, dict) else None
        if not isinstance(error, dict) or not error.get("code") or not error.get("message"):
            return f"no error code and message: {where}"
    elif re.fullmatch(r"/v1/models/[^/]+/predict", path) and body is not None:
        if len(content["outputs"]) != len(json.loads(body)["inputs"]):
            return f"not one output per input: {where}"
    return None
