"""The errors the server answers with, each code once with its HTTP status and when it is
given: the request checks and the decoding core raise :class:`RequestError` by code, the
app answers it with the code's status, and the OpenAPI description lists the codes of
each status from :data:`CODES`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Code:
    """An error code's HTTP status and when the server gives it."""

    status: int
    when: str


CODES: dict[str, Code] = {
    "malformed_json": Code(400, "The body (or a WebSocket message) is not JSON, or not UTF-8."),
    "bad_request": Code(400, "The request is not HTTP/1.1 that can be parsed."),
    "unauthorized": Code(401, "A token is set and the request lacks it."),
    "unknown_model": Code(404, "No model of that name."),
    "not_found": Code(404, "No such route."),
    "method_not_allowed": Code(405, "The route does not take this method."),
    "header_timeout": Code(408, "The request's line and headers took more than header_timeout_s."),
    "body_timeout": Code(408, "The body did not arrive within timeout_s."),
    "idle_timeout": Code(408, "A WebSocket session sent nothing for stream_idle_s."),
    "too_many_inputs": Code(413, "More than max_inputs inputs or pairs."),
    "body_too_large": Code(413, "A body over max_body_bytes."),
    "unsupported_media_type": Code(415, "The body is not declared 'Content-Type: application/json'."),
    "invalid_request": Code(422, "Wrong types, unknown fields, options out of range, or a value past "
                                 "the limits (error.field names it)."),
    "invalid_message": Code(422, "A WebSocket message that is not {\"words\": ...} or {\"end\": ...}."),
    "invalid_input": Code(422, "An input the task cannot read or encode."),
    "input_too_long": Code(422, "More than max_input_tokens source tokens, or the model's positions."),
    "beam_too_large": Code(422, "A beam over max_beam."),
    "cannot_score": Code(422, "The model's task cannot read targets."),
    "cannot_stream": Code(422, "The model cannot decode a stream."),
    "decoding_failed": Code(422, "Decoding refused the request's settings or inputs."),
    "client_disconnected": Code(499, "The client went away before its answer (never read)."),
    "internal_error": Code(500, "The server failed; its log says why."),
    "queue_full": Code(503, "max_queue requests are waiting already (see Retry-After)."),
    "shutting_down": Code(503, "The server stopped before decoding the request (see Retry-After)."),
    "too_many_streams": Code(503, "max_streams WebSocket sessions are open already."),
    "timeout": Code(504, "Not decoded within timeout_s."),
}

#: How much of a name a client sent (a model's, a field's) an error echoes.
ECHOED = 100


def clip(text: str) -> str:
    """``text``, cut to ``ECHOED`` characters: an error does not echo a 100 KB name back."""
    return text if len(text) <= ECHOED else text[:ECHOED] + "..."


class RequestError(Exception):
    """A request the server refuses: a code of :data:`CODES` and a JSON-ready error naming
    what was wrong (the ``field`` of the body, such as ``inputs[0]`` or ``alpha``, where
    one was; and the limit, where one was passed); ``retry_after``: the seconds after which
    the same request may succeed."""

    def __init__(self, code: str, message: str, *, limit: str | None = None, field: str | None = None,
                 retry_after: int | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"no error code {code!r} in seqtrans.serving.errors.CODES")
        super().__init__(message)
        self.code = code
        self.message = message
        self.limit = limit
        self.field = None if field is None else clip(field)  # a field may be named by a client's key
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return CODES[self.code].status

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.limit is not None:
            error["limit"] = self.limit
        return {"error": error}
