"""Large product outputs in memory reused from one decoding step to the next: handed out
again only once nothing refers to the last one, per thread, given back when the scope
ends; decoding that writes its logits there finds what it finds without."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.vocab import EOS
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import generate
from seqtrans.linear import onednn as onednn_module
from seqtrans.linear.onednn import onednn_available
from seqtrans.runtime import buffers

CPU = torch.device("cpu")


@pytest.fixture
def every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_outside_a_scope_and_below_the_size_nothing_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)
    assert buffers.output(4, 8).shape == (4, 8)
    assert getattr(buffers._local, "buffer", None) is None  # outside a scope
    monkeypatch.setattr(buffers, "MIN_BYTES", 4 * 8 * 4 + 1)
    with buffers.reused():
        buffers.output(4, 8)
        assert getattr(buffers._local, "buffer", None) is None
        buffers.output(4, 9)  # at least MIN_BYTES
        assert buffers._local.buffer is not None


def test_an_output_is_reused_only_once_nothing_holds_the_last(every_size: None) -> None:
    with buffers.reused():
        a = buffers.output(3, 5)
        a.fill_(1.0)
        held = a[1:]  # a view of it still held
        del a
        b = buffers.output(3, 5)
        assert not _same_memory(b, held)
        assert torch.equal(held, torch.ones(2, 5))
        del held, b
        c = buffers.output(3, 5)
        array = c.numpy()  # an array over it holds it too
        del c
        d = buffers.output(3, 5)
        assert d.data_ptr() != array.__array_interface__["data"][0]
        del array, d
        # smaller outputs and other types take the front of the same buffer
        e = buffers.output(2, 2, dtype=torch.int32)
        assert e.dtype == torch.int32 and e.shape == (2, 2) and e.is_contiguous()
        kept = buffers._local.buffer
        assert e.data_ptr() == kept.data_ptr()
        del e
        f = buffers.output(4, 5)  # larger: a new buffer, the old one given back first
        assert f.shape == (4, 5) and buffers._local.buffer.numel() == 4 * 5 * 4
    assert buffers._local.buffer is None  # given back with the scope


def test_scopes_nest_and_threads_keep_their_own(every_size: None) -> None:
    with buffers.reused():
        with buffers.reused():
            buffers.output(2, 3)
        assert buffers._local.buffer is not None  # the outer scope still holds it
        mine = buffers._local.buffer.data_ptr()
        seen: list[int] = []

        def other() -> None:
            with buffers.reused():
                out = buffers.output(2, 3)
                seen.append(out.data_ptr())

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert seen and seen[0] != mine
    assert buffers._local.buffer is None


def _hypotheses(model: torch.nn.Module, config: DecodeConfig) -> list[list[tuple[list[int], float]]]:
    g = torch.Generator().manual_seed(2)
    sources = [torch.randint(4, 60, (int(n),), generator=g).tolist() + [EOS] for n in (3, 9, 5, 12, 7)]
    found = generate(model, sources, config, device=CPU)
    return [[(list(h.tokens), h.score) for h in hyps] for hyps in found]


@pytest.fixture
def counted_reuse(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Each time decoding asked whether the buffer was free: the answer."""
    answers: list[bool] = []
    unshared = buffers._unshared

    def counting(buffer: torch.Tensor) -> bool:
        answers.append(unshared(buffer))
        return answers[-1]

    monkeypatch.setattr(buffers, "_unshared", counting)
    yield answers


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN linear operator")
@pytest.mark.parametrize("config", [DecodeConfig(beam=4, max_len_b=6, nbest=2),
                                    DecodeConfig(beam=1, max_len_b=6),
                                    DecodeConfig(beam=1, max_len_b=6, sample=2, seed=3)],
                         ids=["beam", "greedy", "sampling"])
def test_decoding_into_reused_logits_finds_what_it_finds_without(config: DecodeConfig,
                                                                 counted_reuse: list[bool],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a projection packed in blocks, whose logits are gathered into the buffer
    monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", 60 * 16 * 4 // 3)
    model = tiny_model(vocab=60, seed=3)
    expected = _hypotheses(model, config)
    assert not counted_reuse
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)
    assert _hypotheses(model, config) == expected
    assert any(counted_reuse)  # the logits did go to the kept buffer
    # an ensemble holds one member's logits while the other's are made: those are not overwritten
    members = Ensemble([tiny_model(vocab=60, seed=3), tiny_model(vocab=60, seed=4)], [1.0, 2.0])
    counted_reuse.clear()
    with_reuse = _hypotheses(members, config)
    assert not all(counted_reuse)  # the second member's found the first's held
    monkeypatch.setattr(buffers, "MIN_BYTES", 1 << 40)
    assert with_reuse == _hypotheses(members, config)


def test_int8_decoding_into_reused_logits_finds_the_same(native_kernels: None,
                                                         counted_reuse: list[bool],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(vocab=60, seed=5)
    config = DecodeConfig(beam=4, max_len_b=6, nbest=2, precision="int8")
    expected = _hypotheses(model, config)
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)
    assert _hypotheses(model, config) == expected
    assert any(counted_reuse)


def test_threads_decoding_at_once_find_what_one_finds_alone(every_size: None) -> None:
    model = tiny_model(vocab=60, seed=6)
    config = DecodeConfig(beam=4, max_len_b=6)
    expected = _hypotheses(model, config)
    found: list[object] = []

    def decode() -> None:
        for _ in range(3):
            found.append(_hypotheses(model, config))

    threads = [threading.Thread(target=decode) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == [expected] * 6
