"""The OpenAPI description of the HTTP API, served at ``/openapi.json``; a test checks
that it names every route the app has."""

from __future__ import annotations

from typing import Any

from seqtrans import __version__
from seqtrans.serving.models import LENGTH_PENALTIES, MAX_ALPHA

STRING, NUMBER, INTEGER, BOOLEAN = ({"type": t} for t in ("string", "number", "integer", "boolean"))


def _object(required: tuple[str, ...] = (), *, closed: bool = False, **properties: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def _array(items: dict[str, Any], **limits: int) -> dict[str, Any]:
    return {"type": "array", "items": items, **limits}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERROR = _object(("error",), error=_object(("code", "message"), code=STRING, message=STRING, field={
    "type": "string", "description": "Where in the body the problem is, such as inputs[0] or alpha."}, limit={
    "type": "string", "description": "The setting whose limit was passed."}))
REASONS = {400: "Malformed JSON.", 401: "Missing or wrong bearer token.", 404: "No such model.",
           408: "The body did not arrive within timeout_s.",
           413: "Too many inputs, or too large a body.",
           415: "The body is not declared 'Content-Type: application/json'.",
           422: "Wrong types, options or inputs, or values past the limits (error.field names it).",
           499: "The client went away (never read).",
           503: "The queue is full, or the server is stopping (see Retry-After).",
           504: "Not decoded within timeout_s."}
NAME = [{"name": "name", "in": "path", "required": True, "schema": STRING}]


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json(ERROR, REASONS[s]) for s in statuses}


def _post(summary: str, body: dict[str, Any], answer: dict[str, Any], description: str) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": NAME,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                     "responses": {"200": _json(answer, description),
                                   **_errors(400, 401, 404, 408, 413, 415, 422, 499, 503, 504)}}}


def _get(summary: str, answer: dict[str, Any], *, named: bool = False, errors: tuple[int, ...] = (401,),
         ) -> dict[str, Any]:
    return {"get": {"summary": summary, **({"parameters": NAME} if named else {}),
                    "responses": {"200": answer, **_errors(*errors)}}}


def schema() -> dict[str, Any]:
    hypothesis = _object(output=STRING, score={"type": "number", "description": "What beam search ranks by."},
                         log_prob=NUMBER, normalized_score=NUMBER, tokens=_array(STRING))
    predict = _object(("inputs",), closed=True, inputs=_array(STRING, minItems=1),
                      beam={"type": "integer", "minimum": 1}, nbest={"type": "integer", "minimum": 1},
                      alpha={"type": "number", "minimum": 0, "maximum": MAX_ALPHA},
                      length_penalty={"enum": list(LENGTH_PENALTIES)},
                      precision={"enum": ["fp32", "bf16", "int8"]},
                      scores={"type": "boolean", "description": "Each hypothesis with its scores."},
                      attention={"type": "boolean", "description": "The best output's encoder-decoder "
                                 "attention, layers and heads averaged."},
                      source_lang={"type": "string", "description": "The sources' language, for a model of "
                                   "several (one of the model's languages, GET /v1/models/NAME)."},
                      target_lang={"type": "string", "description": "The language to translate into, for a "
                                   "model of several."})
    attention = _object(source=_array(STRING), target=_array(STRING),
                        weights={**_array(_array(NUMBER)), "description": "A row per target token."})
    outputs = _object(model=STRING, outputs=_array(_object(output=STRING, hypotheses=_array(hypothesis),
                                                           attention=attention)))
    score = _object(("pairs",), closed=True, pairs=_array(_array(STRING, minItems=2, maxItems=2), minItems=1))
    scores = _object(model=STRING, scores=_array(_object(log_prob=NUMBER, per_token=NUMBER, tokens=INTEGER,
                                                         normalized_score=NUMBER)))
    model = _object(name=STRING, task=STRING, decode={"type": "object"}, attention={"type": "object"},
                    ensemble=INTEGER, streaming=BOOLEAN,
                    languages={**_array(STRING), "description": "The language codes of a model of several."})
    status = _json(_object(status=STRING), "The status.")
    return {
        "openapi": "3.1.0",
        "info": {"title": "seqtrans serve", "version": __version__},
        "paths": {
            "/health": _get("Alive.", status, errors=()),
            "/ready": {"get": {"summary": "Models loaded and warm.", "responses": {
                "200": status, "503": _json(_object(status=STRING), "Warming up.")}}},
            "/metrics": _get("Prometheus metrics.", {"description": "OK", "content": {"text/plain": {}}}),
            "/openapi.json": _get("This description.", _json({"type": "object"}, "OpenAPI 3.1."), errors=()),
            "/v1/models": _get("The models served.", _json(_object(models=_array(model)), "The models.")),
            "/v1/models/{name}": _get("One model.", _json(model, "The model."), named=True,
                                      errors=(401, 404)),
            "/v1/models/{name}/predict": _post("Decode inputs.", predict, outputs,
                                               "One output per input, in order."),
            "/v1/models/{name}/score": _post("Score given source-target pairs.", score, scores,
                                             "One score per pair, in order."),
            "/v1/models/{name}/stream": {"get": {
                "summary": "WebSocket: simultaneous translation (docs/serving.md gives its messages).",
                "parameters": NAME, "responses": {"101": {"description": "Switching to WebSocket."}}}},
        },
    }
