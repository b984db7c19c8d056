"""The HTTP application: routes under ``/v1``, probes, metrics and the page.

Every answer is JSON (the page and the metrics aside); every refusal is an ``error``
object with a ``code``, a ``message`` and, where a limit was passed, the ``limit``'s name.
Nothing a request says is taken as a path: models are the ones loaded at start, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from concurrent.futures import Executor
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from torch import Tensor

from seqtrans.attention import reading
from seqtrans.data.batches import source_ids
from seqtrans.data.vocab import EOS
from seqtrans.decoding import generate
from seqtrans.decoding.ensemble import position_limit
from seqtrans.decoding.search import Hypothesis
from seqtrans.errors import SeqtransError
from seqtrans.inference.details import attention_weights
from seqtrans.inference.scoring import score_ids
from seqtrans.serving import validation
from seqtrans.serving.batching import Batcher, Deadline, Expired, QueueFull, Stopped
from seqtrans.serving.metrics import CONTENT_TYPE, Metrics
from seqtrans.serving.middleware import Guard
from seqtrans.serving.models import (
    Prediction,
    RequestError,
    Scoring,
    Served,
    clip,
    outputs,
    parse_predict,
    parse_score,
)
from seqtrans.serving.openapi import schema
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.workers import Workers, current_worker, decoding_workers
from seqtrans.streaming.websocket import StreamSlots, stream

log = logging.getLogger(__name__)
#: What a decoding worker gets of a request: its model, the checked request, its deadline.
Work = tuple[Served, Prediction | Scoring, Deadline]


class Server:
    """The state the routes share: the models, the batcher, the metrics and readiness."""

    def __init__(self, models: Mapping[str, Served], settings: ServeSettings,
                 workers: Workers | None = None) -> None:
        self.models = dict(models)
        self.settings = settings
        self.workers = workers
        self.metrics = Metrics()
        self.batcher: Batcher | None = None
        self.ready = False
        self.slots = StreamSlots(limit=settings.max_streams, gauge=self.metrics.streams)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """The batcher for the app's lifetime; the models warm up in each of its workers meanwhile."""
        workers = self.workers if self.workers is not None else decoding_workers(self.settings.workers)
        batcher = Batcher(self.decode, max_tokens=self.settings.max_batch_tokens,
                          max_wait_s=self.settings.max_wait_ms / 1000, max_queue=self.settings.max_queue,
                          workers=workers)
        self.batcher = batcher
        batcher.start()
        warming = asyncio.ensure_future(self._warm_workers(workers))
        warming.add_done_callback(lambda f: _warmed(self, f))
        try:
            yield
        finally:
            await batcher.stop()

    async def body(self, request: Request, arrived: float) -> Any:
        """The request's JSON, read within what is left of its time limit (408 beyond:
        a client sending its body slowly holds a connection no longer than a request);
        415 unless it is declared ``application/json``."""
        settings = self.settings
        json_only(request)
        left = settings.timeout_s - (time.monotonic() - arrived)
        try:
            return await asyncio.wait_for(read_json(request, settings.max_body_bytes), max(left, 0.0))
        except asyncio.TimeoutError:
            late = f"the body did not arrive within {settings.timeout_s:g} s"
            raise RequestError(408, "body_timeout", late, limit="timeout_s") from None
        except RequestError as exc:
            if exc.status == 499:
                self.metrics.disconnected.inc()
            raise

    async def submit(self, served: Served, key: Hashable, work: Prediction | Scoring,
                     arrived: float, request: Request) -> Any:
        """The result of a request through the batcher, within the time limit; a request
        that passes it, or whose client disconnects, leaves the queue at once, or its batch
        at the next decoding step."""
        assert self.batcher is not None
        self.metrics.queue_depth.observe(self.batcher.depth)
        deadline = Deadline(arrived + self.settings.timeout_s)
        try:
            future = self.batcher.submit(key, work.tokens, (served, work, deadline))
        except QueueFull:
            raise RequestError(503, "queue_full", f"{self.settings.max_queue} requests are waiting already; "
                               "try again shortly", limit="max_queue", headers={"Retry-After": "1"}) from None
        self.metrics.queued.set(self.batcher.depth)
        left = self.settings.timeout_s - (time.monotonic() - arrived)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({future, gone}, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED)
            if not future.done() or isinstance(future.exception(), Expired):
                deadline.withdraw()  # leaves its batch at the next step
                future.cancel()  # or the queue
                if gone.done():
                    self.metrics.disconnected.inc()
                    raise RequestError(499, "client_disconnected", "the client went away before its answer")
                raise RequestError(504, "timeout", f"not decoded within {self.settings.timeout_s:g} s",
                                   limit="timeout_s")
            return future.result()
        except SeqtransError as exc:
            raise RequestError(422, "decoding_failed", str(exc)) from None
        except Stopped:
            raise RequestError(503, "shutting_down", "the server stopped before decoding this request",
                               headers={"Retry-After": "1"}) from None
        finally:
            gone.cancel()
            deadline.withdraw()  # in case this handler itself was cancelled
            if not future.done():
                future.cancel()
            self.metrics.queued.set(self.batcher.depth)

    def decoding_thread(self) -> Executor:
        """The decoding worker for a new streaming session (the workers in turn; once the
        app has started)."""
        assert self.batcher is not None, "the app's lifespan starts the batcher"
        return self.batcher.workers.next()

    def model(self, name: str) -> Served:
        served = self.models.get(name)
        if served is None:
            raise RequestError(404, "unknown_model",
                               f"no model named {clip(name)!r}; GET /v1/models lists them")
        return served

    def decode(self, works: Sequence[Work]) -> list[list[dict[str, Any]] | Expired]:
        """The outputs of requests of one model and one kind (predictions of one decoding
        setting, or scores), decoded together in a decoding worker; :class:`Expired` for
        each request whose deadline passed meanwhile (its decoding stopped there)."""
        if isinstance(works[0][1], Scoring):
            return self.score(works)
        started = time.monotonic()
        served, first, _ = works[0]
        assert isinstance(first, Prediction)
        requests = [p for _, p, _ in works if isinstance(p, Prediction)]
        deadlines = [d for _, _, d in works]
        sources = [s for p in requests for s in p.sources]
        owner = [k for k, p in enumerate(requests) for _ in p.sources]
        # each input seeds its sampling stream by its place in its own request, so that a
        # request's outputs do not depend on the requests it was batched with
        positions = [i for p in requests for i in range(len(p.sources))]
        _, hyps = served.loaded.decode(sources, decode=first.decode, positions=positions,
                                       cancelled=lambda i: deadlines[owner[i]].passed)
        expired = [d.passed for d in deadlines]
        maps = self._attention(served, [p for p, gone in zip(requests, expired) if not gone],
                               [h for h, k in zip(hyps, owner) if not expired[k]])
        live = iter(maps)  # one per input of the requests still wanted
        out: list[list[dict[str, Any]] | Expired] = []
        start = 0
        for p, gone in zip(requests, expired):
            end = start + len(p.sources)
            if gone:
                out.append(Expired())
                self.metrics.expired_inputs.inc(len(p.sources))
            else:
                own = [next(live) for _ in p.sources]
                out.append(outputs(served, p, hyps[start:end], own if p.attention else None))
            start = end
        tokens = sum(len(h[0].tokens) for h in hyps if h)
        self.metrics.batch(len(works), len(sources), tokens, time.monotonic() - started,
                           worker=current_worker())
        return out

    @staticmethod
    def _attention(served: Served, requests: Sequence[Prediction],
                   hyps: Sequence[list[Hypothesis]]) -> list[Tensor | None]:
        """The encoder-decoder attention [T, S] of each best output whose request asked
        for it (None for the others), by one teacher-forced pass."""
        asked = [p.attention for p in requests for _ in p.sources]
        picked = [i for i, a in enumerate(asked) if a]
        maps: list[Tensor | None] = [None] * len(asked)
        if not picked:
            return maps
        loaded = served.loaded
        sources = [s for p in requests for s in p.sources]
        codec = requests[0].codec  # a batch's requests share their languages (the batcher's key)
        ids = [source_ids(codec, sources[i]) for i in picked]
        targets = [hyps[i][0].tokens if hyps[i] else [] for i in picked]
        weights = attention_weights(loaded.searcher, ids, targets, layer=None, device=loaded.device,
                                    batch_tokens=loaded.config.decode.batch_tokens)
        for i, w in zip(picked, weights):
            maps[i] = w
        return maps

    def score(self, works: Sequence[Work]) -> list[list[dict[str, Any]] | Expired]:
        """The scores of score requests of one model, computed together (those whose
        deadline has passed: :class:`Expired`)."""
        served = works[0][0]
        expired = [d.passed for _, _, d in works]
        requests = [p for (_, p, _), gone in zip(works, expired) if isinstance(p, Scoring) and not gone]
        decode = served.loaded.config.decode
        with reading(decode):
            scores = score_ids(served.loaded.searcher, [s for r in requests for s in r.sources],
                               [t for r in requests for t in r.targets], batch_tokens=decode.batch_tokens,
                               device=served.loaded.device, precision=decode.precision)
        out: list[list[dict[str, Any]] | Expired] = []
        start = 0
        for r in requests:
            out.append([{"log_prob": s.log_prob, "per_token": s.per_token, "tokens": s.tokens,
                         "normalized_score": s.normalized(decode.alpha, kind=decode.length_penalty)}
                        for s in scores[start:start + len(r.sources)]])
            start += len(r.sources)
        done = iter(out)
        return [Expired() if gone else next(done) for gone in expired]

    async def _warm_workers(self, workers: Workers) -> None:
        """:meth:`warm` in each worker in turn (the first makes the int8 or oneDNN copies
        that the others then share)."""
        loop = asyncio.get_running_loop()
        for executor in workers:
            await loop.run_in_executor(executor, self.warm)

    def warm(self) -> None:
        """Decode one empty source with each model, so that the first request does not pay
        for the first call's set-up (allocations, int8 or oneDNN copies)."""
        for served in self.models.values():
            loaded = served.loaded
            generate(loaded.searcher, [[EOS]], loaded.config.decode, device=loaded.device,
                     position_limit=position_limit(loaded.searcher), shortlist=loaded.shortlist)


def build_app(models: Mapping[str, Served], settings: ServeSettings, *,
              token: str | None = None, workers: Workers | None = None) -> Starlette:
    """The ASGI app serving ``models`` by name; with ``token``, every route but the page
    and the probes needs ``Authorization: Bearer TOKEN``. ``workers``: the decoding
    workers (the first of which loaded the models); by default ``settings.workers`` of
    the app's own (:func:`~seqtrans.serving.workers.decoding_workers`)."""
    server = Server(models, settings, workers)

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("seqtrans.serving").joinpath("page.html").read_text("utf-8"))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def ready(request: Request) -> Response:
        if server.ready:
            return JSONResponse({"status": "ready", "models": sorted(server.models)})
        return JSONResponse({"status": "warming"}, status_code=503, headers={"Retry-After": "1"})

    async def metrics(request: Request) -> Response:
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE)

    async def openapi(request: Request) -> Response:
        return JSONResponse(schema())

    async def list_models(request: Request) -> Response:
        return JSONResponse({"models": [s.describe() for s in server.models.values()]})

    async def show_model(request: Request) -> Response:
        return JSONResponse(server.model(request.path_params["name"]).describe())

    async def predict(request: Request) -> Response:
        arrived = time.monotonic()
        served = server.model(request.path_params["name"])
        prediction = parse_predict(served, await server.body(request, arrived), settings)
        result = await server.submit(served, (served.name, prediction.decode), prediction, arrived, request)
        return JSONResponse({"model": served.name, "outputs": result})

    async def score(request: Request) -> Response:
        arrived = time.monotonic()
        served = server.model(request.path_params["name"])
        scoring = parse_score(served, await server.body(request, arrived), settings)
        result = await server.submit(served, (served.name, "score"), scoring, arrived, request)
        return JSONResponse({"model": served.name, "scores": result})

    routes = [Route("/", page), Route("/health", health), Route("/ready", ready), Route("/metrics", metrics),
              Route("/openapi.json", openapi),
              Route("/v1/models", list_models), Route("/v1/models/{name}", show_model),
              Route("/v1/models/{name}/predict", predict, methods=["POST"]),
              Route("/v1/models/{name}/score", score, methods=["POST"]),
              WebSocketRoute("/v1/models/{name}/stream", lambda ws: stream(server, ws))]
    handlers = {RequestError: _refused, HTTPException: _http_error, Exception: _internal_error}
    return Starlette(routes=routes, lifespan=server.lifespan, exception_handlers=handlers,
                     middleware=[Middleware(Guard, metrics=server.metrics, token=token)])


def _warmed(server: Server, future: asyncio.Future[None]) -> None:
    if future.cancelled() or future.exception() is not None:
        log.error("warming the models failed: %s", None if future.cancelled() else future.exception())
        return
    server.ready = True
    log.info("models ready: %s", ", ".join(server.models))


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
        raise RequestError(415, "unsupported_media_type", f"a request body must be sent as "
                           f"'Content-Type: application/json', got {got}")


async def read_json(request: Request, limit: int) -> Any:
    """The request's body as JSON (:func:`seqtrans.serving.validation.read`); 413 past
    ``limit`` bytes (read no further), 400 when it is not JSON, 422 when it holds what no
    route takes, 499 when the client disconnects before the body's end."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body_too_large", f"a body of {declared} bytes, more than the {limit} "
                           "allowed", limit="max_body_bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, "body_too_large", f"a body of more than the {limit} bytes allowed",
                                   limit="max_body_bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        gone = "the client went away while sending its body"
        raise RequestError(499, "client_disconnected", gone) from None
    return validation.read(b"".join(chunks))


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    if exc.status == 499:
        log.info("%s %s: %s", request.method, request.url.path, exc.message)
    # ASCII JSON: whatever a message quotes from the request, the answer can be encoded
    return Response(json.dumps(exc.body()), status_code=exc.status, headers=exc.headers,
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
