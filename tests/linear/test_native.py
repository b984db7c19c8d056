"""The native CPU kernels against PyTorch: the beam cache's attention against a sequential
loop over each hypothesis's own keys, the int8 passes bit for bit against PyTorch's
operators, whole beam searches with and without them, and the fallback where no
compiler works. The kernels are built into a cache of the test session
(``native_kernels`` in conftest): where a compiler is found and the build fails, these
tests fail rather than skip. The build itself: ``$CC`` with arguments, a compile that
runs too long, a failed build remembered."""

from __future__ import annotations

import math
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from conftest import require_native_kernels, tiny_model
from seqtrans import native
from seqtrans.attention.cache import BeamKVCache, KVCache
from seqtrans.data.vocab import EOS, PAD
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.linear import int8
from seqtrans.linear.int8 import Int8Linear, quantize_rows
from seqtrans.linear.quantize import quantized
from seqtrans.model import norms
from seqtrans.model.norms import RMSNorm

needs_native = pytest.mark.usefixtures("native_kernels")
CPU = torch.device("cpu")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


#: The library as built here (this processor's instructions: AVX-512 intrinsics where it
#: has them), with AVX2 only, and for the x86-64 baseline (the plain loops).
BUILDS = {"native": ("-march=native", "-fopenmp"), "avx2": ("-mavx2", "-mfma", "-fopenmp"),
          "plain": ("-fopenmp",)}


@pytest.fixture(params=list(BUILDS))
def build(request: Any, native_kernels: None, monkeypatch: Any) -> str:
    """Each test with the library built each way this processor can run."""
    name = request.param
    if name == "avx2" and not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this processor has no AVX2 and FMA")
    if name != "native" and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the other builds are x86 builds")
    monkeypatch.setattr(native, "OPTIONAL_FLAGS", (BUILDS[name],))
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    if not native.available():
        pytest.fail(f"the {name} build failed: {native.unavailable_reason()}")
    return name


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                        length: int, lengths: list[int] | None = None, bias: torch.Tensor | None = None,
                        scale: float | None = None) -> torch.Tensor:
    """One hypothesis, one head, one position at a time, in float64.  -> [N, H, d]"""
    n, heads, dim = q.shape
    out = torch.zeros(n, heads, dim, dtype=torch.float64)
    for r in range(n):
        seen = length if lengths is None else lengths[r]
        for h in range(heads):
            keys = torch.stack([k[int(rows[r, s]), h, s] for s in range(seen)]).double()  # [L, d]
            values = torch.stack([v[int(rows[r, s]), h, s] for s in range(seen)]).double()
            scores = keys @ q[r, h].double() * (1 / math.sqrt(dim) if scale is None else scale)
            if bias is not None:
                scores = scores + bias[h, :seen].double()
            out[r, h] = torch.softmax(scores, dim=0) @ values
    return out


@needs_native
@pytest.mark.parametrize(("n", "heads", "dim", "length", "group"),
                         [(6, 2, 16, 5, 3), (7, 3, 20, 1, 1), (4, 1, 33, 9, 4), (5, 2, 64, 12, 2),
                          # the AVX2 build's register-held sums: 64 dimensions, then 8, then one by one
                          (3, 2, 72, 11, 3), (2, 1, 130, 6, 1)])
def test_beam_attention_equals_a_sequential_loop(n: int, heads: int, dim: int, length: int, group: int,
                                                 build: str) -> None:
    gen = torch.Generator().manual_seed(n * 100 + length)
    buffer_rows, capacity = n + 2, length + 3
    q = torch.randn(n, heads, dim, generator=gen)
    k = torch.randn(buffer_rows, heads, capacity, dim, generator=gen) * 3
    v = torch.randn(buffer_rows, heads, capacity, dim, generator=gen)
    rows = torch.randint(0, buffer_rows, (n, capacity + 2), generator=gen)  # a wider row stride than used
    got = native.beam_attention(q, k, v, rows, length, group=group)
    torch.testing.assert_close(got.double(), reference_attention(q, k, v, rows, length), atol=1e-5, rtol=1e-5)


@needs_native
@pytest.mark.parametrize(("n", "length", "group"), [(6, 5, 3), (4, 37, 4), (3, 1, 1)])
def test_beam_attention_with_a_position_bias_equals_a_sequential_loop(n: int, length: int, group: int,
                                                                      build: str) -> None:
    gen = torch.Generator().manual_seed(n + length)
    heads, dim = 3, 16
    q = torch.randn(n, heads, dim, generator=gen)
    k = torch.randn(n, heads, length, dim, generator=gen)
    v = torch.randn(n, heads, length, dim, generator=gen)
    rows = torch.randint(0, n, (n, length), generator=gen)
    bias = torch.randn(heads, length, generator=gen) * 4  # as T5's relative bias, unscaled logits
    got = native.beam_attention(q, k, v, rows, length, group=group, scale=1.0, bias=bias)
    torch.testing.assert_close(got.double(), reference_attention(q, k, v, rows, length, bias=bias, scale=1.0),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="bias"):  # one position too many
        native.beam_attention(q, k, v, rows, length, bias=torch.zeros(heads, length + 1))


@needs_native
@pytest.mark.parametrize("group", [1, 3])
def test_beam_attention_over_each_rows_own_length_equals_a_sequential_loop_and_ignores_the_others(
        group: int, build: str) -> None:
    gen = torch.Generator().manual_seed(group)
    n, heads, dim, length = 6, 2, 20, 37  # past two blocks of 16 positions
    q = torch.randn(n, heads, dim, generator=gen)
    k = torch.randn(3, heads, length, dim, generator=gen) * 3
    v = torch.randn(3, heads, length, dim, generator=gen)
    rows = torch.randint(0, 3, (n, length), generator=gen)
    lengths = [37, 1, 16, 17, 5, 33]
    got = native.beam_attention(q, k, v, rows, length, group=group, lengths=torch.tensor(lengths))
    torch.testing.assert_close(got.double(), reference_attention(q, k, v, rows, length, lengths),
                               atol=1e-5, rtol=1e-5)
    # a row alone, with what lies past its length changed, gets the same bits
    for r in range(n):
        spoiled = v.clone()
        spoiled[:, :, lengths[r]:] = float("nan")
        alone = native.beam_attention(q[r:r + 1].contiguous(), k, spoiled, rows[r:r + 1], length,
                                      lengths=torch.tensor(lengths[r:r + 1]))
        assert torch.equal(alone[0], got[r])


@needs_native
def test_beam_attention_refuses_what_it_cannot_read() -> None:
    q, kv, rows = torch.zeros(2, 1, 4), torch.zeros(2, 1, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="length 4 outside 1..3"):
        native.beam_attention(q, kv, kv, rows, 4)
    with pytest.raises(TypeError, match="float32"):
        native.beam_attention(q.double(), kv, kv, rows, 1)
    with pytest.raises(ValueError, match="do not match"):
        native.beam_attention(torch.zeros(2, 1, 5), kv, kv, rows, 1)
    with pytest.raises(ValueError, match="rows outside the 2 buffer rows"):
        native.beam_attention(q, kv, kv, torch.tensor([[0, 2, 0], [1, 1, 1]]), 2)
    with pytest.raises(ValueError, match="lengths outside 1..2"):
        native.beam_attention(q, kv, kv, rows, 2, lengths=torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="lengths"):
        native.beam_attention(q, kv, kv, rows, 2, lengths=torch.tensor([2]))


@needs_native
@pytest.mark.parametrize(("m", "k", "o"),
                         [(1, 5, 3), (7, 256, 768), (33, 1024, 256), (5, 33, 35), (300, 64, 48)])
@pytest.mark.parametrize("unsigned", [True, False])
def test_the_int8_passes_give_pytorchs_bits(m: int, k: int, o: int, unsigned: bool, build: str,
                                            monkeypatch: Any) -> None:
    gen = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=gen) * 3
    x[0] = 0.0  # a row of zeros keeps scale 1
    assert all(torch.equal(a, b) for a, b in zip(native.quantize_rows(x, unsigned=unsigned),
                                                   quantize_rows(x, unsigned=unsigned)))
    w, b = torch.randn(o, k, generator=gen) * 0.05, torch.randn(o, generator=gen)
    layers = [Int8Linear(w, b, unsigned=unsigned), Int8Linear(w, None, unsigned=unsigned)]
    fused = [layer(x) for layer in layers]
    fused_relu = [layer(x, relu=True) for layer in layers]
    assert (fused_relu[0] == 0).any() and (fused_relu[0] > 0).any()
    monkeypatch.setenv("SEQTRANS_NATIVE", "0")
    for layer, got, got_relu in zip(layers, fused, fused_relu):
        assert torch.equal(got, layer(x))
        assert torch.equal(got_relu, torch.relu(layer(x)))
        assert torch.equal(got_relu, layer(x, relu=True))


@pytest.fixture
def int8_product_kernel(native_kernels: None) -> None:
    """The native kernels, with their int8 product (built where the processor has AVX-512 VNNI or AVX2)."""
    if not native.int8_product_available():
        pytest.skip("the native int8 product needs AVX-512 VNNI or AVX2")


needs_int8_product = pytest.mark.usefixtures("int8_product_kernel")


@needs_int8_product
@pytest.mark.parametrize(("m", "k", "o"),
                         [(1, 512, 512), (4, 512, 37), (5, 65, 7), (9, 2048, 13), (3, 1, 1), (16, 200, 130),
                          (2, 63, 4), (7, 0, 5)])
def test_the_native_int8_product_gives_pytorchs_integers(m: int, k: int, o: int) -> None:
    gen = torch.Generator().manual_seed(m * k + o)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (o, k), dtype=torch.int8, generator=gen)
    if k:  # the extremes, whose sums of four products are the largest an int32 lane takes
        x[0], w[0] = 255, -128
    expected = torch._int_mm(x, w.t()) if k else torch.zeros(m, o, dtype=torch.int32)
    assert torch.equal(native.int8_product(x, w), expected)


@needs_int8_product
@pytest.mark.parametrize(("m", "k", "o"),
                         [(8, 512, 300), (9, 33, 7), (10, 15, 1), (13, 1, 5), (67, 17, 2), (64, 256, 100),
                          (11, 2048, 13), (130, 70, 37), (128, 1024, 97), (33, 1024, 100)])
def test_the_native_int8_product_over_many_rows_gives_pytorchs_integers_in_every_build(
        m: int, k: int, o: int, build: str) -> None:
    # rows and weight rows that are not whole tiles (4 x 3 with AVX2), inputs not whole vectors,
    # and products large enough for every thread
    if not native.int8_product_available():
        pytest.skip(f"the {build} build has no int8 product")
    gen = torch.Generator().manual_seed(m * k + o)
    x = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (o, k), dtype=torch.int8, generator=gen)
    x[0], w[0], x[-1], w[-1] = 255, -128, 255, 127  # the extremes, in the first and the last tiles
    x[1] = 0
    assert torch.equal(native.int8_product(x, w), torch._int_mm(x, w.t()))


@needs_int8_product
def test_the_native_int8_product_refuses_what_it_cannot_read() -> None:
    x, w = torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(3, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="rows of 8 against a weight of"):
        native.int8_product(x, w[:, :4].contiguous())
    with pytest.raises(ValueError, match="uint8 rows and an int8 weight"):
        native.int8_product(x.to(torch.int8), w)
    with pytest.raises(ValueError, match="uint8 rows and an int8 weight"):
        native.int8_product(x, w.t())


@needs_int8_product
@pytest.mark.parametrize(("m", "k", "o"), [(1, 512, 512), (4, 70, 37), (16, 129, 5), (3, 2048, 9)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_the_native_int8_layer_gives_the_bits_of_its_three_passes(m: int, k: int, o: int, bias: bool,
                                                                  relu: bool) -> None:
    gen = torch.Generator().manual_seed(m + k + o)
    wide = torch.randn(m, k + 3, generator=gen) * 2
    x = wide[:, 1 : k + 1]  # rows further apart than their length
    x[0] = 0.0  # a row of zeros keeps scale 1
    b = torch.randn(o, generator=gen) if bias else None
    layer = Int8Linear(torch.randn(o, k, generator=gen) * 0.05, b, unsigned=True)
    xq, xs = native.quantize_rows(x, unsigned=True)
    acc = torch._int_mm(xq, layer.qweight.t())
    expected = native.dequantize(acc, xs, layer.scale, compensation=layer.compensation, bias=layer.bias,
                                 relu=relu)
    got = native.int8_linear(x, layer.qweight, layer.scale, compensation=layer.compensation, bias=layer.bias,
                             relu=relu)
    assert torch.equal(got, expected)


@needs_int8_product
def test_the_native_int8_layer_refuses_what_does_not_match() -> None:
    layer = Int8Linear(torch.randn(6, 8), torch.randn(6), unsigned=True)
    args = {"compensation": layer.compensation, "bias": layer.bias}
    with pytest.raises(ValueError, match=r"rows \(2, 5\)"):
        native.int8_linear(torch.zeros(2, 5), layer.qweight, layer.scale, **args)
    with pytest.raises(ValueError, match="its 6 outputs"):
        native.int8_linear(torch.zeros(2, 8), layer.qweight, layer.scale[:5].contiguous(), **args)
    with pytest.raises(ValueError, match="float64"):
        native.int8_linear(torch.zeros(2, 8, dtype=torch.float64), layer.qweight, layer.scale, **args)


@needs_int8_product
def test_int8_layers_time_both_ways_as_they_decode_then_keep_one(monkeypatch: Any) -> None:
    monkeypatch.setattr(int8, "torch_product_is_native", lambda: True)  # VNNI: two ways to time

    monkeypatch.setattr(int8, "_trials", {})
    used = {"native": 0, "torch": 0}

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            used[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(native, "int8_linear_unchecked", counted("native", native.int8_linear_unchecked))
    monkeypatch.setattr(int8, "_torch_product", counted("torch", int8._torch_product))
    gen = torch.Generator().manual_seed(0)
    layer = Int8Linear(torch.randn(70, 96, generator=gen), torch.randn(70, generator=gen), unsigned=True)
    x = torch.randn(4, 96, generator=gen)
    outs = [layer(x) for _ in range(2 * int8.CHOICE_TRIALS + 4)]
    assert all(torch.equal(out, outs[0]) for out in outs)  # whichever way made them
    key = (4, 96, 70, torch.get_num_threads())
    assert set(int8.product_choices()) == {key}
    assert min(used.values()) == int8.CHOICE_TRIALS  # each timed in turn, then one kept
    assert sum(used.values()) == len(outs)
    big = torch.randn(int8.NATIVE_ROWS + 1, 96, generator=gen)
    before = used["native"]
    layer(big)
    assert used["native"] == before and key in int8.product_choices()  # many rows: PyTorch's alone


@needs_int8_product
@pytest.mark.parametrize("rows", [1, 4, int8.NATIVE_ROWS + 1, 130])
def test_without_vnni_the_native_layer_serves_every_row_count_with_the_same_bits(monkeypatch: Any,
                                                                                rows: int) -> None:
    # there PyTorch's int8 product is a plain loop: nothing to time it against
    monkeypatch.setattr(int8, "torch_product_is_native", lambda: False)
    monkeypatch.setattr(int8, "_trials", {})
    gen = torch.Generator().manual_seed(rows)
    layer = Int8Linear(torch.randn(37, 70, generator=gen), torch.randn(37, generator=gen), unsigned=True)
    x = torch.randn(rows, 70, generator=gen)
    expected = layer._passes(x, relu=True, fused=True)  # PyTorch's product
    calls: list[object] = []
    monkeypatch.setattr(int8, "_torch_product", lambda *a: calls.append(a))
    assert torch.equal(layer(x, relu=True), expected)
    assert not calls and not int8.product_choices()


def _step(cache: KVCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if isinstance(cache, BeamKVCache):
        cache.store(k, v)
        return cache.attend(q)
    keys, values = cache.append(k, v)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values)


@needs_native
def test_the_beam_cache_attends_like_the_copying_cache_through_reorders_and_finished_sentences(
        build: str) -> None:
    gen = torch.Generator().manual_seed(0)
    beam, heads, dim = 3, 2, 8
    caches = [kind(4 * beam, heads, dim, 2, dtype=torch.float32, device=CPU)
              for kind in (KVCache, BeamKVCache)]
    for cache in caches:
        cache.beam = beam
    sentences = 4
    # each step: random parents within each sentence's beam, some sentences finished
    # (``keep``: those that stay); five steps pass the capacity of 2, so both caches grow
    for keep in (None, torch.tensor([0, 2, 3]), None, torch.tensor([2]), None):
        n = sentences * beam
        q, k, v = (torch.randn(n, heads, 1, dim, generator=gen) for _ in range(3))
        outs = [_step(cache, q, k, v) for cache in caches]
        torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)
        beam_keys, beam_values = caches[1].gathered()
        assert torch.equal(beam_keys, caches[0].k[:, :, : caches[0].length])
        assert torch.equal(beam_values, caches[0].v[:, :, : caches[0].length])
        parents = torch.randint(0, beam, (sentences, beam), generator=gen)
        blocks = torch.arange(sentences) if keep is None else keep
        rows = (blocks.unsqueeze(1) * beam + parents[blocks]).flatten()
        for cache in caches:
            cache.reorder(rows, keep)
        sentences = blocks.numel()


def _searches(model: torch.nn.Module, src: torch.Tensor, monkeypatch: Any) -> list[Any]:
    """Beam (4) and greedy outputs of ``model``, with and without the native kernels."""
    max_len = torch.tensor([9, 6, 12])
    outputs = []
    for setting in ("1", "0"):
        monkeypatch.setenv("SEQTRANS_NATIVE", setting)
        outputs.append((beam_search(model, src, beam=4, alpha=0.6, max_len=max_len, nbest=2),
                        greedy_search(model, src, max_len=max_len)))
    return outputs


@needs_native
@pytest.mark.parametrize("int8", [False, True])
def test_searches_find_the_same_outputs_with_the_kernels(int8: bool, monkeypatch: Any) -> None:
    model = tiny_model(vocab=13, seed=3, d_model=32, d_ff=64)
    if int8:
        model = quantized(model)
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 4, EOS, PAD, PAD], [10, 11, 12, 4, EOS]])
    (beam_on, greedy_on), (beam_off, greedy_off) = _searches(model, src, monkeypatch)
    for on, off in zip(beam_on + greedy_on, beam_off + greedy_off):
        assert [h.tokens for h in on] == [h.tokens for h in off]
        for a, b in zip(on, off):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_without_a_compiler_decoding_falls_back_to_pytorch(monkeypatch: Any, tmp_path: Any,
                                                           caplog: Any) -> None:
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", os.path.join(str(tmp_path), "no-such-compiler"))
    assert not native.available()
    assert "no-such-compiler" in (native.unavailable_reason() or "")
    assert "native decoding kernels unavailable" in caplog.text
    model = tiny_model()
    for beam in (1, 3):
        cache = model.start(model.encode(torch.tensor([[5, 6, EOS]])), beam=beam).caches[0]
        assert type(cache) is KVCache
    hyps = beam_search(model, torch.tensor([[5, 6, EOS]]), beam=3, alpha=0.6, max_len=torch.tensor([5]))
    assert hyps[0]


@needs_native
def test_the_library_is_built_once_and_reused(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(tmp_path))
    assert native.available()
    built = list((tmp_path / "native").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"  # no temporary left behind
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    stamp = built[0].stat().st_mtime_ns
    assert native.available() and built[0].stat().st_mtime_ns == stamp


def fake_compiler(tmp_path: Path, body: str) -> str:
    """A compiler command (for ``$CC``) that appends its arguments to ``calls.log`` in
    ``tmp_path`` and then runs the shell code ``body`` (its arguments in "$@")."""
    script = tmp_path / "fake-cc"
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(tmp_path / "calls.log"))}\n{body}\n')
    script.chmod(0o755)
    return str(script)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def fresh(monkeypatch: Any, tmp_path: Path) -> Path:
    """A process that has not loaded the kernels, with an empty cache; -> the cache."""
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setenv("SEQTRANS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SEQTRANS_NATIVE", raising=False)
    return tmp_path / "cache"


def real_compiler() -> str:
    command = native.compiler()
    if not command or not shutil.which(command[0]):
        pytest.skip("no C compiler")
    return command[0]


@pytest.mark.skipif(sys.platform == "win32", reason="the fake compiler is a shell script")
def test_cc_may_carry_arguments(fresh: Path, monkeypatch: Any, tmp_path: Path) -> None:
    cc = real_compiler()
    # drops its first argument, which it insists on, and compiles with the real compiler
    wrapper = fake_compiler(tmp_path, f'[ "$1" = "--from-cc" ] || exit 3\nshift\nexec {shlex.quote(cc)} "$@"')
    monkeypatch.setenv("CC", f"{wrapper} --from-cc")
    assert native.available(), native.unavailable_reason()
    assert calls(tmp_path)[0].startswith("--from-cc -O3")
    assert [p.suffix for p in (fresh / "native").iterdir()] == [".so"]


@pytest.mark.skipif(sys.platform == "win32", reason="the fake compiler is a shell script")
def test_a_failed_build_is_remembered_and_not_retried_by_the_next_process(
        fresh: Path, monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "echo 'kernels.c:1: error: broken' >&2\nexit 1"))
    assert not native.available()
    assert "broken" in (native.unavailable_reason() or "")
    tried = len(calls(tmp_path))
    assert tried == len(native.OPTIONAL_FLAGS)  # every set of flags, once
    markers = list((fresh / "native").glob("*.failed"))
    assert len(markers) == 1 and "broken" in markers[0].read_text()
    monkeypatch.setattr(native, "_failed", None)  # as a new process finds it
    assert not native.available()
    assert len(calls(tmp_path)) == tried and "delete" in (native.unavailable_reason() or "")
    markers[0].unlink()  # deleting the marker tries again
    monkeypatch.setattr(native, "_failed", None)
    assert not native.available() and len(calls(tmp_path)) == 2 * tried


@pytest.mark.skipif(sys.platform == "win32", reason="the fake compiler is a shell script")
def test_a_compile_that_hangs_is_stopped(fresh: Path, monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "exec sleep 60"))
    monkeypatch.setattr(native, "BUILD_TIMEOUT_S", 0.5)
    assert not native.available()
    assert "ran past 0.5 s" in (native.unavailable_reason() or "")
    assert len(calls(tmp_path)) == 1  # the other flags would hang as long
    assert list((fresh / "native").glob("*.failed"))


@pytest.mark.skipif(sys.platform == "win32", reason="the fake compiler is a shell script")
def test_the_kernel_tests_fail_where_a_compiler_is_found_but_the_build_fails(
        fresh: Path, monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "exit 1"))
    with pytest.raises(pytest.fail.Exception, match="do not build"):
        require_native_kernels()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native, "_failed", None)
    with pytest.raises(pytest.skip.Exception, match="no C compiler"):
        require_native_kernels()


@pytest.mark.parametrize(("rows", "width", "k"),
                         [(32, 32000, 8), (5, 130, 1), (3, 7, 7), (4, 64, 6), (1, 65, 3)])
def test_topk_rows_equals_torch_topk(rows: int, width: int, k: int) -> None:
    require_native_kernels()
    generator = torch.Generator().manual_seed(rows * width + k)
    x = torch.randn(rows, width, generator=generator) * 3
    x[0, : (width - k) // 2] = float("-inf")  # as beam search's first step has (no tie among the k)
    found = native.topk_rows(x, k)
    assert found is not None
    values, index = found
    expected = x.topk(k, dim=1)
    assert torch.equal(values, expected.values) and torch.equal(index, expected.indices)
    strided = torch.randn(rows, width + 3, generator=generator)[:, :width]  # rows further apart
    found = native.topk_rows(strided, k)
    assert found is not None and torch.equal(found[1], strided.topk(k, dim=1).indices)


def test_topk_rows_breaks_ties_by_the_lower_index_and_leaves_nan_to_torch() -> None:
    require_native_kernels()
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [float("-inf")] * 5])
    found = native.topk_rows(x, 3)
    assert found is not None
    assert found[1].tolist() == [[1, 2, 4], [0, 1, 2]] and found[0][0].tolist() == [3.0, 3.0, 3.0]
    x[1, 2] = float("nan")
    assert native.topk_rows(x, 2) is None
    with pytest.raises(ValueError, match="k = 6 for rows of 5"):
        native.topk_rows(x, 6)
    with pytest.raises(ValueError, match="float32 CPU matrix"):
        native.topk_rows(x.double(), 2)


def test_beam_candidates_refuses_a_k_beyond_its_rows_and_any_other_matrix() -> None:
    require_native_kernels()
    x, prefix, never = torch.zeros(2, 5), torch.zeros(2), torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="beam_candidates: k = 6 for rows of 5"):
        native.beam_candidates(x, prefix, 6, never=never)
    with pytest.raises(ValueError, match="beam_candidates takes a float32 CPU matrix"):
        native.beam_candidates(x.t(), prefix, 2, never=never)


@needs_int8_product
@pytest.mark.parametrize(("m", "k", "o"), [(1, 512, 512), (4, 70, 37), (64, 129, 45)])
def test_a_bias_after_the_scales_is_the_bias_added_to_the_output_bit_for_bit(m: int, k: int, o: int) -> None:
    gen = torch.Generator().manual_seed(m + k + o)
    x = torch.randn(m, k, generator=gen) * 2
    b = torch.randn(o, generator=gen) * 3
    b[0] = float("-inf")  # a column an imported model never emits
    layer = Int8Linear(torch.randn(o, k, generator=gen) * 0.05, unsigned=True)
    args = {"compensation": layer.compensation}
    plain = native.int8_linear(x, layer.qweight, layer.scale, **args)
    after = native.int8_linear(x, layer.qweight, layer.scale, **args, bias=b, bias_after=True)
    assert torch.equal(after, plain + b)
    xq, xs = native.quantize_rows(x, unsigned=True)
    acc = native.int8_product(xq, layer.qweight)
    assert torch.equal(native.dequantize(acc, xs, layer.scale, **args, bias=b, bias_after=True), after)
    # fused, one rounding: other bits somewhere, so the test above can tell them apart
    assert not torch.equal(native.int8_linear(x, layer.qweight, layer.scale, **args, bias=b), after)


@needs_native
@pytest.mark.parametrize("width", [8, 13, 64, 100, 512, 768, 1000, 2048, 4100])
def test_rms_norm_kernel_gives_f_rms_norm_bits(width: int) -> None:
    lanes = norms._lanes_matching(width)
    if torch.backends.cpu.get_cpu_capability() == "AVX2":  # PyTorch sums in vectors of 8 floats here
        assert lanes == 8
    if not lanes:
        pytest.skip(f"PyTorch here ({torch.backends.cpu.get_cpu_capability()}) sums otherwise")
    generator = torch.Generator().manual_seed(width)
    weight = torch.randn(width, generator=generator)
    for rows in (1, 3, 8, 64):
        x = torch.randn(rows, width, generator=generator) * torch.rand(rows, 1, generator=generator) * 5
        expected = F.rms_norm(x, (width,), weight, 1e-6)
        assert torch.equal(native.rms_norm(x, weight, 1e-6, lanes=lanes), expected)
        assert torch.equal(expected, weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)))


@needs_native
def test_rms_norm_module_uses_the_kernel_only_without_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    if not norms._lanes_matching(64):
        pytest.skip("PyTorch here sums otherwise")
    calls = []
    kernel = native.rms_norm
    monkeypatch.setattr(native, "rms_norm", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    norm = RMSNorm(64, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 3, 64)
    trained = norm(x)
    assert not calls and trained.requires_grad
    with torch.no_grad():
        decoded = norm(x)
    assert calls and torch.equal(decoded, trained.detach())


@needs_native
def test_rms_norm_kernel_is_refused_where_its_bits_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = native.rms_norm
    up = torch.tensor(1e9)
    monkeypatch.setattr(native, "rms_norm", lambda *a, **k: torch.nextafter(kernel(*a, **k), up))  # one ulp
    monkeypatch.setattr(norms, "_native_lanes", {})
    assert norms._lanes_matching(64) == 0
    assert norms._lanes_matching(7) == 0  # narrower than any vector: PyTorch sums those otherwise
    norm = RMSNorm(64, eps=1e-6)
    x = torch.randn(4, 64)
    with torch.no_grad():
        assert torch.equal(norm(x), F.rms_norm(x, (64,), norm.weight, 1e-6))
