"""The HTTP application: routes under ``/v1``, probes, metrics and the page. It only
translates: each route reads its request (the body's media type, size and time limit,
its JSON) and calls the decoding core (:mod:`seqtrans.serving.core`); each refusal is
answered with its code's status (:data:`seqtrans.serving.errors.CODES`).

Every answer is JSON (the page and the metrics aside); every refusal is an ``error``
object with a ``code``, a ``message`` and, where a limit was passed, the ``limit``'s name.
Nothing a request says is taken as a path: models are the ones loaded at start, by name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from seqtrans.serving import validation
from seqtrans.serving.core import Core
from seqtrans.serving.errors import RequestError, clip
from seqtrans.serving.metrics import CONTENT_TYPE
from seqtrans.serving.middleware import Guard
from seqtrans.serving.models import Served
from seqtrans.serving.openapi import schema
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.workers import Workers
from seqtrans.streaming.websocket import stream

log = logging.getLogger(__name__)


def build_app(models: Mapping[str, Served], settings: ServeSettings, *,
              token: str | None = None, workers: Workers | None = None) -> Starlette:
    """The ASGI app serving ``models`` by name; with ``token``, every route but the page
    and the probes needs ``Authorization: Bearer TOKEN``. ``workers``: the decoding
    workers (the first of which loaded the models); by default ``settings.workers`` of
    the app's own (:func:`~seqtrans.serving.workers.decoding_workers`)."""
    core = Core(models, settings, workers)

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("seqtrans.serving").joinpath("page.html").read_text("utf-8"))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> Response:
        if core.ready:
            return JSONResponse({"status": "ready", "models": sorted(core.models)})
        return JSONResponse({"status": "warming"}, status_code=503, headers={"Retry-After": "1"})

    async def metrics(request: Request) -> Response:
        return Response(core.metrics.exposition(), media_type=CONTENT_TYPE)

    async def openapi(request: Request) -> Response:
        return JSONResponse(schema())

    async def list_models(request: Request) -> Response:
        return JSONResponse({"models": [s.describe() for s in core.models.values()]})

    async def show_model(request: Request) -> Response:
        return JSONResponse(core.model(request.path_params["name"]).describe())

    async def predict(request: Request) -> Response:
        arrived = time.monotonic()
        served = core.model(request.path_params["name"])
        body = await read_body(core, request, arrived)
        answer = await core.predict(served, body, arrived=arrived, gone=lambda: _disconnected(request))
        return JSONResponse(answer)

    async def score(request: Request) -> Response:
        arrived = time.monotonic()
        served = core.model(request.path_params["name"])
        body = await read_body(core, request, arrived)
        answer = await core.score(served, body, arrived=arrived, gone=lambda: _disconnected(request))
        return JSONResponse(answer)

    routes = [Route("/", page), Route("/health", health), Route("/ready", ready), Route("/metrics", metrics),
              Route("/openapi.json", openapi),
              Route("/v1/models", list_models), Route("/v1/models/{name}", show_model),
              Route("/v1/models/{name}/predict", predict, methods=["POST"]),
              Route("/v1/models/{name}/score", score, methods=["POST"]),
              WebSocketRoute("/v1/models/{name}/stream", lambda ws: stream(core, ws))]
    handlers = {RequestError: _refused, HTTPException: _http_error, Exception: _internal_error}
    return Starlette(routes=routes, lifespan=lambda app: core.running(), exception_handlers=handlers,
                     middleware=[Middleware(Guard, metrics=core.metrics, token=token)])


async def read_body(core: Core, request: Request, arrived: float) -> Any:
    """The request's JSON, read within what is left of its time limit (408 beyond: a
    client sending its body slowly holds a connection no longer than a request); 415
    unless it is declared ``application/json``."""
    settings = core.settings
    json_only(request)
    left = settings.timeout_s - (time.monotonic() - arrived)
    try:
        return await asyncio.wait_for(read_json(request, settings.max_body_bytes), max(left, 0.0))
    except asyncio.TimeoutError:
        late = f"the body did not arrive within {settings.timeout_s:g} s"
        raise RequestError("body_timeout", late, limit="timeout_s") from None
    except RequestError as exc:
        if exc.code == "client_disconnected":
            core.metrics.disconnected.inc()
        raise


async def _disconnected(request: Request) -> None:
    """Return when the client of ``request`` (its body read) has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def json_only(request: Request) -> None:
    """Refuse (415) a body not declared ``application/json``. A web page on any site may
    send text/plain or a form to this server without asking first (no CORS preflight);
    a JSON body it can send only after a preflight, which this server never answers."""
    declared = request.headers.get("content-type", "")
    if declared.split(";")[0].strip().lower() != "application/json":
        got = f"Content-Type {clip(declared)!r}" if declared else "no Content-Type"
        raise RequestError("unsupported_media_type", f"a request body must be sent as "
                           f"'Content-Type: application/json', got {got}")


async def read_json(request: Request, limit: int) -> Any:
    """The request's body as JSON (:func:`seqtrans.serving.validation.read`); 413 past
    ``limit`` bytes (read no further), 400 when it is not JSON, 422 when it holds what no
    route takes, 499 when the client disconnects before the body's end."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError("body_too_large", f"a body of {declared} bytes, more than the {limit} "
                           "allowed", limit="max_body_bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError("body_too_large", f"a body of more than the {limit} bytes allowed",
                                   limit="max_body_bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        gone = "the client went away while sending its body"
        raise RequestError("client_disconnected", gone) from None
    return validation.read(b"".join(chunks))


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    if exc.code == "client_disconnected":
        log.info("%s %s: %s", request.method, request.url.path, exc.message)
    headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    # ASCII JSON: whatever a message quotes from the request, the answer can be encoded
    return Response(json.dumps(exc.body()), status_code=exc.status, headers=headers,
                    media_type="application/json")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code,
                        headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": {"code": "internal_error", "message": "the server failed to answer this "
                                   "request; its log says why"}}, status_code=500)
