"""Shared fixtures: tiny seeded models and the location of the shared data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqtrans.config import ModelConfig
from seqtrans.model import Transformer
from seqtrans.tasks import SourceWalk
from seqtrans.testing import serve_directory
from seqtrans.vocab import EOS, PAD

# the walk of source-cursor test models: token 4 of the target consumes a unit, a unit
# starts at source tokens 4 and 6; target token 5 opens a span, 6 closes one
TEST_WALK = SourceWalk(advance=(4,), starts=(4, 6), opens=(5,), closes=(6,))

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def tiny_model(*, vocab: int = 11, seed: int = 0, **overrides: object) -> Transformer:
    """A 2-layer, width-16 model in eval mode, deterministic for ``seed`` (walking
    :data:`TEST_WALK` with ``source_cursor=True`` or ``span_cursor=True``)."""
    torch.manual_seed(seed)
    options = {"encoder_layers": 2, "decoder_layers": 2, "d_model": 16, "d_ff": 32, "heads": 4,
               "dropout": 0.0, **overrides}
    model = Transformer(ModelConfig(**options), source_vocab_size=vocab, target_vocab_size=vocab,
                        shared_vocab=True, walk=TEST_WALK)
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
