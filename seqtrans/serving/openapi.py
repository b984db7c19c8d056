"""The OpenAPI description of the HTTP API, served at ``/openapi.json``: the routes, with
the schemas of their bodies and answers written from their declarations
(:mod:`seqtrans.serving.requests`, :mod:`seqtrans.serving.answers`) and their errors'
codes from :data:`seqtrans.serving.errors.CODES`. A test checks that it names every route
the app has; others, that it holds what the server takes and answers."""

from __future__ import annotations

from typing import Any

from seqtrans import __version__
from seqtrans.serving import answers, requests
from seqtrans.serving.errors import CODES

STRING = {"type": "string"}
NAME = [{"name": "name", "in": "path", "required": True, "schema": STRING}]
#: The errors of a route that decodes.
DECODING = (400, 401, 404, 408, 413, 415, 422, 499, 503, 504)


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _reasons(status: int) -> str:
    return " ".join(f"{code}: {c.when}" for code, c in CODES.items() if c.status == status)


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json(answers.ERROR.schema(), _reasons(s)) for s in statuses}


def _post(summary: str, body: dict[str, Any], answer: dict[str, Any], description: str) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": NAME,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                     "responses": {"200": _json(answer, description), **_errors(*DECODING)}}}


def _get(summary: str, answer: dict[str, Any], *, named: bool = False, errors: tuple[int, ...] = (401,),
         ) -> dict[str, Any]:
    return {"get": {"summary": summary, **({"parameters": NAME} if named else {}),
                    "responses": {"200": answer, **_errors(*errors)}}}


def schema() -> dict[str, Any]:
    status = _json(answers.STATUS.schema(), "The status.")
    stream = ("WebSocket: simultaneous translation. The client sends StreamMessage; the server answers "
              "StreamToken, StreamWord and StreamDone messages, or an Error before closing "
              "(#/components/schemas; docs/serving.md gives their order).")
    return {
        "openapi": "3.1.0",
        "info": {"title": "seqtrans serve", "version": __version__},
        "paths": {
            "/health": _get("Alive.", status, errors=()),
            "/ready": {"get": {"summary": "Models loaded and warm.", "responses": {
                "200": status, "503": _json(answers.STATUS.schema(), "Warming up.")}}},
            "/metrics": _get("Prometheus metrics.", {"description": "OK", "content": {"text/plain": {}}}),
            "/openapi.json": _get("This description.", _json({"type": "object"}, "OpenAPI 3.1."), errors=()),
            "/v1/models": _get("The models served.", _json(answers.MODELS.schema(), "The models.")),
            "/v1/models/{name}": _get("One model.", _json(answers.DESCRIBED.schema(), "The model."),
                                      named=True, errors=(401, 404)),
            "/v1/models/{name}/predict": _post("Decode inputs.", requests.PREDICT.schema(),
                                               answers.PREDICTED.schema(), "One output per input, in order."),
            "/v1/models/{name}/score": _post("Score given source-target pairs.", requests.SCORE.schema(),
                                             answers.SCORES.schema(), "One score per pair, in order."),
            "/v1/models/{name}/stream": {"get": {
                "summary": "WebSocket: simultaneous translation.", "description": stream, "parameters": NAME,
                "responses": {"101": {"description": "Switching to WebSocket."}}}},
        },
        "components": {"schemas": {
            "StreamMessage": requests.STREAM_MESSAGE.schema(), "StreamToken": answers.TOKEN.schema(),
            "StreamWord": answers.WORD.schema(), "StreamDone": answers.DONE.schema(),
            "Error": answers.ERROR.schema()}},
    }
