"""Helpers for the test suites of task plugins (and of seqtrans itself).

:func:`seqtrans.tasks.contract.check_task` checks a task against the contract; the
helpers here serve files over HTTP on the loopback interface, so that a plugin's
downloads can be tested through ``seqtrans.runtime.download``'s mirror override without the
network::

    with serve_directory(Path("tests/data")) as mirror:
        task = MyTask(MyConfig(mirror=mirror))
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqtrans.runtime import environment

__all__ = ["serve", "serve_directory", "without_download_settings"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve with ``handler`` on 127.0.0.1 (a free port) while the context is open;
    yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serve_directory(directory: str | Path) -> contextlib.AbstractContextManager[str]:
    """Serve the files of ``directory`` by name; yields the base URL (a mirror)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    return serve(handler)  # type: ignore[arg-type]  # a partial of a handler class


def without_download_settings(monkeypatch: Any) -> None:
    """Unset ``$SEQTRANS_MIRROR`` and ``$SEQTRANS_CACHE_DIR`` for one test (``monkeypatch``
    is pytest's fixture), so that the machine's settings do not reach the downloads it tests."""
    for name in (environment.MIRROR, environment.CACHE_DIR):
        monkeypatch.delenv(name, raising=False)
