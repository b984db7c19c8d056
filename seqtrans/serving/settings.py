"""The server's settings: each default and its help live here once; ``seqtrans serve``
builds its flags from these fields and docs/serving.md lists them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from seqtrans.config.schema import option
from seqtrans.errors import ConfigError


@dataclass(frozen=True)
class ServeSettings:
    """How ``seqtrans serve`` listens, batches and limits requests."""

    host: str = option("127.0.0.1", "The address to listen on; localhost only unless told otherwise.")
    port: int = option(8000, "The TCP port to listen on.")
    max_batch_tokens: int = option(
        4000, "Source tokens (end symbols included) of the requests decoded together in one batch, at "
        "most; a single request larger than this is decoded alone.")
    max_wait_ms: float = option(
        5.0, "How long the first request of a batch waits for others to join it, in milliseconds; 0 "
        "decodes what has arrived at once.")
    max_queue: int = option(
        64, "Requests waiting to be decoded, at most; one more is refused with 503 and Retry-After.")
    workers: int = option(
        1, "Decoding workers: threads that each decode one batch (or a streaming session's step) at a "
        "time, side by side, each computing with --threads threads (default: the process's threads "
        "shared among them). 1 decodes one batch at a time.")
    max_inputs: int = option(64, "Inputs in one predict or score request, at most (413 beyond).")
    max_input_tokens: int = option(
        256, "Source tokens of one input (without the end symbol), at most (422 beyond).")
    max_body_bytes: int = option(1_000_000, "The size of a request body, at most (413 beyond).")
    max_beam: int = option(16, "The largest beam a request may ask for (422 beyond).")
    max_streams: int = option(
        4, "Simultaneous-translation WebSocket sessions at once, at most; they decode on the server's "
        "decoding workers, each session on one. One more is closed with code 1013 (try again later).")
    stream_idle_s: float = option(
        60.0, "A WebSocket session that sends no message for this long, in seconds, gets an "
        "idle_timeout error and is closed, which frees its slot.")
    timeout_s: float = option(
        30.0, "A request's time limit from its arrival (its headers read): for its body (408 beyond) and "
        "for its answer, queue included (504 beyond; its decoding stops at the next step); also how "
        "long shutdown waits for requests in flight.")
    header_timeout_s: float = option(
        10.0, "How long a client may take to send a request's line and headers, in seconds, from the "
        "connection opening (or the previous answer on it); the connection is then closed, with a 408 "
        "if part of a request had come, so that slow clients cannot hold connections open.")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):  # NaN passes the range checks below
                raise ConfigError(f.name, f"must be a finite number, got {value}")
            if f.name == "max_wait_ms":
                if value < 0:
                    raise ConfigError(f.name, f"must not be negative, got {value}")
            elif f.name == "workers" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f.name, f"must be a whole number of workers, 1 or more, got {value!r}")
            elif f.name == "port":
                if not 0 <= value < 65536:
                    raise ConfigError(f.name, f"must be a TCP port (0 to 65535), got {value}")
            elif isinstance(value, (int, float)) and value <= 0:
                raise ConfigError(f.name, f"must be positive, got {value}")
