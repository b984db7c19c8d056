"""Tiny runs and real servers for the serving tests: uvicorn on a free port in a thread
of this process, or ``seqtrans serve`` in a process of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from seqtrans.serving.app import build_app
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running(models: Mapping[str, Served], settings: ServeSettings | None = None, *,
            token: str | None = None) -> Iterator[str]:
    """The URL of a server of ``models`` (ready) in a thread; stopped on exit."""
    app = build_app(models, settings or ServeSettings(), token=token)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, ws="auto", lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def wait_ready(url: str, *, timeout: float = 120, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process is None or process.poll() is None, "the server process ended"
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.05)


def post_all(url: str, bodies: Sequence[Any], *, headers: Mapping[str, str] | None = None,
             ) -> list[httpx.Response]:
    """POST every body to ``url`` at once (concurrent requests); the answers in order."""

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            return await asyncio.gather(*(client.post(url, json=body) for body in bodies))

    return asyncio.run(send())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_process(*args: str, env: Mapping[str, str] | None = None,
                  ) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``seqtrans serve ARGS --port P`` in a process of its own, ready; its URL and the process
    (killed on exit if it is still running)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "seqtrans", "serve", *args, "--port", str(port)],
                               cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process=process)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)
