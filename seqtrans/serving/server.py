"""Loading the runs and running the server until it is told to stop."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from seqtrans.serving.settings import ServeSettings

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

#: The modules of the serve extra, each with the distribution that provides it.
NEEDED = {"starlette": "starlette", "uvicorn": "uvicorn", "prometheus_client": "prometheus-client",
          "websockets": "websockets"}


def check_installed() -> None:
    """A :class:`UsageError` naming what is missing when the serve extra is not installed."""
    import importlib.util

    from seqtrans.errors import UsageError

    missing = []
    for module, distribution in NEEDED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # a module present in sys.modules as None
            found = False
        if not found:
            missing.append(distribution)
    if missing:
        raise UsageError(f"serving needs {', '.join(missing)}, which is not installed: "
                         "pip install 'seqtrans[serve]'")


def serve(paths: Sequence[str], settings: ServeSettings, *, device: str = "auto",
          token: str | None = None, threads: int | None = None) -> None:
    """Serve the runs ``paths`` (``NAME=RUN_DIR``, ``RUN_DIR`` or an ensemble
    ``NAME=RUN_A,RUN_B``) until SIGINT or SIGTERM, decoding on ``settings.workers``
    workers of ``threads`` threads each (see :func:`seqtrans.runtime.threads.worker_threads`);
    then stop accepting connections, answer the requests in flight (for at most
    ``settings.timeout_s``) and return."""
    check_installed()
    import uvicorn

    from seqtrans.linear.onednn import SERVER_PRIMITIVES, bound_primitive_caches
    from seqtrans.serving.app import build_app
    from seqtrans.serving.models import load_served, model_names
    from seqtrans.serving.workers import decoding_workers

    # before the first product: the caches of built products would otherwise grow the
    # server's memory with every new batch shape it meets, for hours
    log.info("caches of built oneDNN products: %s", bound_primitive_caches(SERVER_PRIMITIVES))
    models = {}
    workers = decoding_workers(settings.workers, threads=threads)
    for name, path in model_names(paths).items():
        models[name] = workers[0].submit(load_served, name, path, device=device).result()
        log.info("model %s: %s (task %s)", name, path, models[name].loaded.config.task)
    app = build_app(models, settings, token=token, workers=workers)
    config = uvicorn_config(app, settings)
    # uvicorn drains on SIGTERM and then raises the signal again under the handler it found;
    # a handler of ours turns that into the normal end of serving (exit status 0)
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def uvicorn_config(app: Any, settings: ServeSettings, **changes: Any) -> uvicorn.Config:
    """How uvicorn runs ``app`` under ``settings``: HTTP/1.1 with the header time limit and
    WebSockets, both refusing in JSON (:mod:`seqtrans.serving.connections`), the app's
    lifespan, and shutdown waiting at most ``timeout_s``; ``changes`` replace any of these options."""
    import uvicorn

    from seqtrans.serving.connections import JsonRefusals, with_header_timeout

    options: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "ws": JsonRefusals, "lifespan": "on",
        "http": with_header_timeout(settings.header_timeout_s),
        "timeout_graceful_shutdown": max(1, int(settings.timeout_s)), "log_level": "info",
        "access_log": False}
    return uvicorn.Config(app, **{**options, **changes})


def _stopped(signum: int, frame: object) -> None:
    log.info("stopped by SIGTERM after answering the requests in flight")
