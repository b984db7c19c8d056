"""Real servers for the serving tests (uvicorn on a free port in a thread of this process,
or ``seqtrans serve`` in a process of its own), and the in-process references their
answers are checked against."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
import pytest
import uvicorn
from test_inference import copy_run

from seqtrans.data.batches import prediction
from seqtrans.decoding.search import length_penalty
from seqtrans.inference.loading import Loaded, load
from seqtrans.serving.app import build_app
from seqtrans.serving.models import Served
from seqtrans.serving.server import uvicorn_config
from seqtrans.serving.settings import ServeSettings
from seqtrans.streaming.predict import stream

ROOT = Path(__file__).resolve().parents[2]


def served_copy(directory: Path) -> Served:
    """The tiny seeded copy model most serving tests share (its run made in ``directory``)."""
    return Served("copy", load(copy_run(directory / "copy", seed=3, vocab_size=30), device="cpu"))


@contextlib.contextmanager
def running(models: Mapping[str, Served], settings: ServeSettings | None = None, *,
            token: str | None = None, ready: bool = True, port: int = 0) -> Iterator[str]:
    """The URL of a server of ``models`` in a thread (once ready, unless ``ready`` is
    false: once listening), on ``port`` (0: a free one); stopped on exit."""
    settings = settings or ServeSettings()
    app = build_app(models, settings, token=token)
    config = uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=None)
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
        if ready:
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
        wait_ready(url, process=process, timeout=300)  # a fresh process imports torch: slow on a busy machine
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)


def reference(loaded: Loaded, text: str, **options: Any) -> dict[str, Any]:
    """What the server should answer for one input, decoded in-process on its own."""
    decode = dataclasses.replace(loaded.config.decode, **{k: v for k, v in options.items() if k != "scores"})
    source = loaded.task.parse_source(text)
    _, [hyps] = loaded.decode([source], decode=decode)
    texts = [loaded.task.format(prediction(loaded.codec, h.tokens, source)) for h in hyps]
    out: dict[str, Any] = {"output": texts[0]}
    if decode.nbest > 1 or options.get("scores"):
        out["hypotheses"] = [{"output": t} for t in texts]
        if options.get("scores"):
            for entry, h in zip(out["hypotheses"], hyps):
                lp = length_penalty(float(len(h.tokens) + 1), decode.alpha, kind=decode.length_penalty)
                entry.update(score=pytest.approx(h.score, abs=1e-4),
                             log_prob=pytest.approx(h.log_prob, abs=1e-4),
                             normalized_score=pytest.approx(h.log_prob / float(lp), abs=1e-4),
                             tokens=loaded.codec.vocabularies.target.decode(h.tokens))
    return out


def streamed(served: Served, sentences: list[list[str]]) -> list[tuple[str, list[int]]]:
    """(tokens, delays) of each sentence as ``predict --stream`` writes them."""
    written: list[str] = []
    events: list[str | None] = [w for s in sentences for w in [*s, None]]
    stream(served.loaded, iter(events), written.append)
    lines = "".join(written).splitlines()
    return [(tokens, [int(d) for d in delays.split()])
            for tokens, _, delays in (line.partition("\t") for line in lines)]
