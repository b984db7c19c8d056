"""Shared fixtures: tiny seeded models and the location of the shared data."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from counting_extension import CountingExtension

from seqtrans import native
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.model.transformer import Transformer
from seqtrans.runtime import environment
from seqtrans.tasks.testing import serve_directory

# tests/ mirrors the package tree, and a test module may share helpers with another
# directory's (``from test_inference import copy_run``): every test directory is importable
# by module name, which pytest's default import mode allows since test file names are unique.
for _directory in sorted(Path(__file__).resolve().parent.glob("*/")):
    if _directory.name not in {"fixtures", "__pycache__", "fake_plugins"} and str(_directory) not in sys.path:
        sys.path.append(str(_directory))

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


def decoding_copy(make: Callable[[Transformer], Transformer],
                  layer: type[torch.nn.Module]) -> tuple[Transformer, Transformer]:
    """A training model and its decoding copy ``make(model)``, checked: the copy is in eval
    mode with every linear layer and the output projection a ``layer``; the model keeps
    its mode, its layers and its values."""
    model = tiny_model(vocab=11, seed=1).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    twin = make(model)
    assert model.training and not twin.training and model.projection is None
    assert not any(isinstance(m, layer) for m in model.modules())
    assert not any(type(m) is torch.nn.Linear for m in twin.modules()) and isinstance(twin.projection, layer)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    return model, twin


def assert_causal(model: Transformer, *, change_seen: bool = True) -> None:
    """Changing the target from each position on changes no output before it (and, with
    ``change_seen``, some output from it on)."""
    src = src_batch()
    tgt = torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 10, 4]])
    base = model(src, tgt)
    for t in range(1, tgt.size(1)):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(4, 11, changed[:, t:].shape)
        out = model(src, changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
        if change_seen:
            assert not torch.allclose(out[:, t:], base[:, t:])


def assert_alone_as_among_others(model: Transformer) -> None:
    """A sentence's scores and encoder states are the same alone as padded in a batch
    beside a longer one."""
    src = torch.tensor([[5, 6, EOS]])
    tgt = torch.tensor([[BOS, 7, 8]])
    alone = model(src, tgt)
    src2 = torch.tensor([[5, 6, EOS, PAD, PAD, PAD], [4, 5, 6, 7, 8, EOS]])
    tgt2 = torch.tensor([[BOS, 7, 8, PAD, PAD], [BOS, 9, 9, 9, 9]])
    together = model(src2, tgt2)
    torch.testing.assert_close(together[0, :3], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.encode(src2).memory[0, :3], model.encode(src).memory[0],
                               atol=1e-5, rtol=1e-5)


def assert_cached_as_full(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, *,
                               split: int) -> None:
    """Decoding ``tgt`` from a cache one token at a time (the cache growing past its
    capacity), and in two calls split at ``split`` (a forced prefix, then the rest), gives
    the teacher-forced scores."""
    full = model(src, tgt)
    state = model.start(model.encode(src), beam=1, capacity=2)
    steps = [model.decode(tgt[:, t : t + 1], state=state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    state = model.start(model.encode(src), beam=1, capacity=tgt.size(1) + 2)
    first = model.decode(tgt[:, :split], state=state)
    rest = model.decode(tgt[:, split:], state=state)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


def src_batch() -> torch.Tensor:
    """Two sources, the second padded.  -> [2, 5]"""
    return torch.tensor([[5, 6, 7, 8, EOS], [9, 4, EOS, PAD, PAD]])


@pytest.fixture
def no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


def require_native_kernels() -> None:
    """Skip where no C compiler is found (or ``SEQTRANS_NATIVE=0``); fail where one is
    and the kernels do not build with it, so that a broken build cannot pass as skipped."""
    command = native.compiler()
    if not command or shutil.which(command[0]) is None:
        pytest.skip(f"no C compiler ({command[0] if command else '$CC, cc or gcc'})")
    if not environment.native_kernels():
        pytest.skip("native kernels turned off (SEQTRANS_NATIVE=0)")
    if not native.available():
        pytest.fail(f"{command[0]} is here, but the native kernels do not build with it: "
                    f"{native.unavailable_reason()}")


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory of this session, where the native kernels are built afresh."""
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture
def native_kernels(kernel_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native kernels, built into :func:`kernel_cache` (not the user's cache, whose
    copy or failure marker would hide the build); see :func:`require_native_kernels`."""
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(kernel_cache))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    require_native_kernels()


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
