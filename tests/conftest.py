"""Shared fixtures: tiny seeded models and the location of the shared data."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqtrans.config import ModelConfig
from seqtrans.model import Transformer
from seqtrans.vocab import EOS, PAD, Cursor

# the walk of source-cursor test models: token 4 of the target consumes a unit, a unit
# starts at source tokens 4 and 6
TEST_CURSOR = Cursor(advance=(4,), starts=(4, 6))

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def tiny_model(*, vocab: int = 11, seed: int = 0, **overrides: object) -> Transformer:
    """A 2-layer, width-16 model in eval mode, deterministic for ``seed`` (walking
    :data:`TEST_CURSOR` with ``source_cursor=True``)."""
    torch.manual_seed(seed)
    options = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 16, "d_ff": 32, "heads": 4,
               "dropout": 0.0, **overrides}
    model = Transformer(ModelConfig(**options), source_vocab_size=vocab, target_vocab_size=vocab,
                        shared_vocab=True, cursor=TEST_CURSOR)
    return model.eval()


def src_batch() -> torch.Tensor:
    """Two sources, the second padded.  -> [2, 5]"""
    return torch.tensor([[5, 6, 7, 8, EOS], [9, 4, EOS, PAD, PAD]])


@pytest.fixture
def no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


@pytest.fixture
def model() -> Transformer:
    return tiny_model()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve with ``handler`` on 127.0.0.1 while the generator is open; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def http_mirror() -> Iterator[str]:
    """The shared Multi30k files served on 127.0.0.1."""
    yield from serve_http(functools.partial(QuietHandler, directory=str(SHARED_DATA / "multi30k")))  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
