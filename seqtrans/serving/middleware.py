"""What every request passes through: the optional bearer token, and the counts and
latency of the answers by route and status."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seqtrans.serving.metrics import Metrics

#: Paths answered without the token: liveness and readiness probes, and the page (which
#: asks for the token itself).
OPEN = ("/", "/health", "/ready")


def route_of(path: str) -> str:
    """The route a path belongs to, as a metrics label (bounded: no model names)."""
    if path in (*OPEN, "/metrics", "/v1/models", "/openapi.json"):
        return path
    if path.startswith("/v1/models/"):
        action = path.rstrip("/").rsplit("/", 1)[-1]
        if action in ("predict", "score", "stream"):
            return f"/v1/models/{{name}}/{action}"
        return "/v1/models/{name}"
    return "other"


class Guard:
    """Checks the bearer token (where one is set) and counts what is answered."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, token: str | None) -> None:
        self.app = app
        self.metrics = metrics
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        route = route_of(scope["path"])
        if self.token is not None and route not in OPEN and not self._authorized(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
            else:
                await _unauthorized(send)
            self.metrics.requests.labels(route, "403" if scope["type"] == "websocket" else "401").inc()
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - started)

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        if scope["type"] == "websocket" and not given:  # browsers cannot set headers on a WebSocket
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = "Bearer " + (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())


async def _unauthorized(send: Send) -> None:
    body: dict[str, Any] = {"error": {"code": "unauthorized",
                                      "message": "this server needs 'Authorization: Bearer TOKEN'"}}
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
