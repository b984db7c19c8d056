"""Shared fixtures: tiny seeded models and the location of the shared data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from counting_extension import CountingExtension

from seqtrans.config import ModelConfig
from seqtrans.model import Transformer
from seqtrans.testing import serve_directory
from seqtrans.vocab import EOS, PAD

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def tiny_model(*, vocab: int = 11, seed: int = 0, extension: bool = False,
               **overrides: object) -> Transformer:
    """A 2-layer, width-16 model in eval mode, deterministic for ``seed``; with
    ``extension``, a :class:`~counting_extension.CountingExtension` attached."""
    torch.manual_seed(seed)
    options = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 16, "d_ff": 32, "heads": 4,
               "dropout": 0.0, **overrides}
    config = ModelConfig(**options)
    model = Transformer(config, source_vocab_size=vocab, target_vocab_size=vocab, shared_vocab=True)
    if extension:
        model.extend({"counting": CountingExtension(config.d_model)})
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


@pytest.fixture
def http_mirror() -> Iterator[str]:
    """The shared Multi30k files served on 127.0.0.1."""
    with serve_directory(SHARED_DATA / "multi30k") as url:
        yield url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
