"""The float32 decoding copy whose linear layers multiply through oneDNN: the same
products as ``F.linear`` up to rounding, a copy that leaves the model alone, the same
search results, and the choice ``generate`` makes for each precision."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import decoding_copy, tiny_model
from seqtrans import native
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS
from seqtrans.decoding.beam import beam_search, greedy_search
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import decoding_model, generate
from seqtrans.errors import UsageError
from seqtrans.linear import onednn as onednn_module
from seqtrans.linear.int8 import Int8Linear
from seqtrans.linear.onednn import FileEmbedding, OneDNNLinear, onednn_available, row_bucket
from seqtrans.linear.quantize import onednn, onednn_cached
from seqtrans.runtime import environment
from seqtrans.runtime.system import cpu_features
from seqtrans.shortlist.search import output_rows

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN linear operator")
CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (2, 5, 64), (3, 1, 64), (3, 13, 64), (0, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_onednn_layer_computes_f_linear(shape: tuple[int, ...], bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g)
    b = torch.randn(48, generator=g) if bias else None
    x = torch.randn(*shape, generator=g)
    layer = OneDNNLinear(w, b)
    assert (layer.in_features, layer.out_features) == (64, 48)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (*shape[:-1], 48)
    # float64 as the reference: both round float32 sums of 64 products
    torch.testing.assert_close(y.double(), F.linear(x.double(), w.double(), b.double() if bias else None),
                               rtol=1e-5, atol=1e-5)


def test_rows_are_padded_to_few_sizes_and_never_by_more_than_an_eighth() -> None:
    sizes = [row_bucket(m) for m in range(1, 8193)]
    assert sizes[:16] == [2, *range(2, 17)]  # one row as two: oneDNN sums a lone row in another order
    assert all(m <= b <= max(2, m * 9 / 8) for m, b in zip(range(1, 8193), sizes))
    assert len(set(sizes)) == 15 + 8 * 9  # eight sizes per doubling from 17 to 8192
    assert all(row_bucket(b) == b for b in sizes)


def test_the_onednn_copy_shares_the_tensors_and_leaves_the_model_alone() -> None:
    model, twin = decoding_copy(onednn, OneDNNLinear)
    assert twin.projection is not None and twin.projection.weight is model.output_weight
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}


def test_decoding_with_the_copy_finds_what_the_model_finds() -> None:
    g = torch.Generator().manual_seed(0)
    sources = [torch.randint(4, 40, (int(n),), generator=g).tolist() + [EOS]
               for n in torch.randint(3, 9, (12,), generator=g)]
    src = pad_batch(sources)
    max_len = torch.full((12,), 8)
    for seed in (0, 1):
        model = tiny_model(vocab=40, seed=seed, d_model=32, d_ff=64)
        twin = onednn(model)
        with torch.inference_mode():
            tgt = src[:, :6]
            torch.testing.assert_close(twin(src, tgt), model(src, tgt), rtol=1e-5, atol=1e-5)
        greedy = [greedy_search(m, src, max_len=max_len) for m in (model, twin)]
        beam = [beam_search(m, src, beam=4, alpha=0.6, max_len=max_len) for m in (model, twin)]
        for ours, theirs in (greedy, beam):
            assert [[h.tokens for h in a] for a in ours] == [[h.tokens for h in b] for b in theirs]
            for a, b in zip(ours, theirs):
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_generate_decodes_fp32_on_the_cpu_with_the_onednn_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(vocab=11, seed=1)
    members = Ensemble([model, tiny_model(vocab=11, seed=2)], [1.0, 1.0])
    fp32 = decoding_model(model, "fp32", CPU)
    assert fp32 is onednn_cached(model) and fp32 is not model  # made once, kept
    assert isinstance(fp32, type(model)) and isinstance(fp32.projection, OneDNNLinear)
    both = decoding_model(members, "fp32", CPU)
    assert isinstance(both, Ensemble) and all(isinstance(m.projection, OneDNNLinear) for m in both.models)
    assert decoding_model(model, "bf16", CPU) is model
    int8 = decoding_model(model, "int8", CPU)
    assert isinstance(int8, type(model)) and isinstance(int8.projection, Int8Linear)
    monkeypatch.setenv("SEQTRANS_TUNE_MATMUL", "0")
    assert decoding_model(model, "fp32", CPU) is model
    monkeypatch.delenv("SEQTRANS_TUNE_MATMUL")
    sources = [[4, 5, 6, 7, 8, 9, EOS], [9, 8, 7, EOS]]
    config = DecodeConfig(beam=3, max_len_b=4)
    out = generate(model, sources, config, device=CPU)
    for src, hyps in zip(sources, out):
        single = beam_search(fp32, pad_batch([src]), beam=3, alpha=config.alpha,
                             max_len=torch.tensor([len(src) - 1 + 4]))[0]
        assert [(h.tokens, h.score) for h in hyps] == [(h.tokens, h.score) for h in single]


def test_the_copy_follows_the_weights_when_they_change() -> None:
    model = tiny_model(vocab=11, seed=1)
    first = onednn_cached(model)
    with torch.no_grad():  # as an optimizer step does: in place
        model.output_weight.mul_(-1.0)
    second = onednn_cached(model)
    assert second is not first
    src = pad_batch([[4, 5, 6, EOS]])
    with torch.inference_mode():
        torch.testing.assert_close(second(src, src[:, :3]), model(src, src[:, :3]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(48, 64), (300, 96)])
def test_the_packed_product_gives_a_row_the_same_bits_in_any_batch_and_team(shape: tuple[int, int]) -> None:
    """The layer reads oneDNN's blocked copy of its weight; each row's sums must not depend
    on the rows beside it (one row is padded to two) or on the threads that compute it."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(*shape, generator=g)
    b = torch.randn(shape[0], generator=g)
    layer = OneDNNLinear(w, b)
    if hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        assert [b.layout for b in layer.packed_weights] == [torch._mkldnn]  # the blocked copy, not the weight
    x = torch.randn(700, shape[1], generator=g)
    threads = torch.get_num_threads()
    out = {}
    try:
        for team in (1, 2):
            torch.set_num_threads(team)
            with torch.inference_mode():
                out[team] = {m: layer(x[:m]) for m in (1, 2, 3, 4, 16, 17, 130, 700)}
    finally:
        torch.set_num_threads(threads)
    alone = out[1][1]
    for team, by_rows in out.items():
        for m, y in by_rows.items():
            assert torch.equal(y[:1], alone), (team, m)
            assert torch.equal(y, out[1][m]), (team, m)
    torch.testing.assert_close(out[1][700].double(), F.linear(x.double(), w.double(), b.double()),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead", [(1,), (1, 1), (4,), (4, 1), (2, 2), (17,), (17, 1), (3, 6), (0, 1)])
@pytest.mark.parametrize("relu", [False, True])
def test_any_leading_shape_gives_each_row_the_bits_it_gets_alone(lead: tuple[int, ...], relu: bool) -> None:
    """Rows that need no padding go to the operator in the caller's shape, a single row as
    itself twice, other counts padded: each row must come out as it does alone."""
    g = torch.Generator().manual_seed(4)
    layer = OneDNNLinear(torch.randn(40, 24, generator=g), torch.randn(40, generator=g))
    x = torch.randn(*lead, 24, generator=g)
    with torch.inference_mode():
        y = layer(x, relu=relu)
        flat = x.reshape(-1, 24)
        alone = [layer(flat[i:i + 1], relu=relu) for i in range(flat.size(0))]
    assert y.shape == (*lead, 40)
    assert y.is_contiguous()
    for i, row in enumerate(alone):
        assert torch.equal(y.reshape(-1, 40)[i:i + 1], row), i


def test_without_packing_the_layer_keeps_no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(40, 32, generator=g), torch.randn(40, generator=g), torch.randn(5, 32, generator=g)
    monkeypatch.setenv("SEQTRANS_PACK_WEIGHTS", "0")
    plain = OneDNNLinear(w, b)
    assert len(plain.packed_weights) == 1 and plain.packed_weights[0] is w  # no second copy in memory
    monkeypatch.delenv("SEQTRANS_PACK_WEIGHTS")
    with torch.inference_mode():
        torch.testing.assert_close(plain(x), OneDNNLinear(w, b)(x), rtol=1e-5, atol=1e-5)


#: In a fresh process: products of 48 row counts, then the memory they left in use (MiB).
_SHAPES_KEPT = """
import ctypes, sys
import torch
from seqtrans.linear.onednn import OneDNNLinear, bound_primitive_caches

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info

def in_use():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd

if sys.argv[1] != "unbounded":
    print(bound_primitive_caches(int(sys.argv[1])), file=sys.stderr)
torch.set_num_threads(1)
layer = OneDNNLinear(torch.randn(64, 32))
layer(torch.randn(2, 32))
start = in_use()
for rows in range(3, 51):
    layer(torch.randn(rows, 32))
print((in_use() - start) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's mallinfo2")
def test_bounded_caches_keep_the_memory_of_few_product_shapes() -> None:
    # each product of a new row count is built and kept by PyTorch's cache and oneDNN's
    # (a third of a MiB for this shape); bounded to 4 entries each, 48 row counts leave
    # the memory of a few
    env = {k: v for k, v in os.environ.items() if k not in environment.PRIMITIVE_CACHES}

    def kept(entries: str) -> float:
        done = subprocess.run([sys.executable, "-c", _SHAPES_KEPT, entries], env=env, cwd=ROOT,
                              capture_output=True, text=True, check=True)
        return float(done.stdout)

    unbounded, bounded = kept("unbounded"), kept("4")
    assert unbounded > 10  # the 48 shapes, all kept
    assert bounded < 3


def test_relu_in_the_product_is_relu_of_the_product_bit_for_bit() -> None:
    torch.manual_seed(0)
    layer = OneDNNLinear(torch.randn(96, 48) / 7, torch.randn(96))
    for rows in (1, 2, 4, 17):
        x = torch.randn(rows, 48)
        assert torch.equal(layer(x, relu=True), layer(x).relu())


def test_a_weight_packed_in_blocks_gives_the_bits_of_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of output rows, each multiplied on its own, sum each output as one product does."""
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(301, 96, generator=g), torch.randn(301, generator=g)
    whole = OneDNNLinear(w, b)
    monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", 301 * 96 * 4 // 4)
    blocked = OneDNNLinear(w, b)
    if hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        assert [block.size(0) for block in blocked.packed_weights] == [76, 75, 75, 75]  # nearly equal
    for lead in ((1,), (2,), (3,), (17,), (130,), (1, 1), (2, 3), (17, 1)):
        x = torch.randn(*lead, 96, generator=g)
        for relu in (False, True):
            y = blocked(x, relu=relu)
            assert y.shape == (*lead, 301) and torch.equal(y, whole(x, relu=relu)), (lead, relu)


def _present_pages(t: torch.Tensor) -> int:
    """How many of the pages under ``t`` this process has resident (/proc/self/pagemap)."""
    page = mmap.PAGESIZE
    start, end = t.data_ptr() // page, -(-(t.data_ptr() + t.numel() * t.element_size()) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start * 8)
        raw = f.read((end - start) * 8)
    return sum(int.from_bytes(raw[i:i + 8], "little") >> 63 for i in range(0, len(raw), 8))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="maps, madvise and /proc are Linux's")
def test_a_tied_table_mapped_from_its_file_stays_resident_once(tmp_path: Path) -> None:
    """The packed projection gives the mapped table's pages back, and the copy's lookups read
    the file, not the map: the table is never resident again, and the results are the bits
    of a copy of the same model in memory of its own."""
    model = tiny_model(vocab=3000, seed=5, d_model=32, d_ff=64)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    mapped = tiny_model(vocab=3000, seed=6, d_model=32, d_ff=64)
    mapped.load_state_dict(torch.load(tmp_path / "m.pt", mmap=True, weights_only=True), assign=True)
    table = mapped.target_embed.weight
    own, twin = onednn(model), onednn(mapped)
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        pytest.skip("this PyTorch packs no weights")
    assert isinstance(twin.target_embed, FileEmbedding) and twin.source_embed is twin.target_embed
    assert not isinstance(own.target_embed, FileEmbedding)  # nothing to give back
    assert _present_pages(table) <= 2  # at most the pages it shares with its neighbours
    ids = torch.tensor([[0, 2999, 17], [5, 5, 1234]])
    assert torch.equal(twin.target_embed(ids), model.target_embed(ids))
    src = pad_batch([[4, 5, 6, 2000, EOS], [2999, 8, EOS]])
    ours, theirs = ([[(h.tokens, h.score) for h in hyps]
                     for hyps in beam_search(m, src, beam=4, alpha=0.6, max_len=torch.full((2,), 6))]
                    for m in (twin, own))
    assert ours == theirs
    assert _present_pages(table) <= 2
    hidden = torch.randn(3, 32)
    with torch.inference_mode():  # a shortlist's rows: read from the file too
        assert torch.equal(twin.projection.rows(ids[0])(hidden), own.projection.rows(ids[0])(hidden))
    assert _present_pages(table) <= 2


@pytest.mark.parametrize("blocks", [1, 4])
def test_a_bias_in_the_product_is_the_bias_added_after_bit_for_bit(blocks: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", 300 * 96 * 4 // blocks)
    plain = OneDNNLinear(torch.randn(300, 96) / 9)
    bias = torch.randn(300) * 5
    bias[7] = float("-inf")  # a column an imported model never emits
    with_bias = plain.plus_bias(bias)
    assert with_bias.packed_weights is plain.packed_weights  # not made twice
    for rows in (1, 2, 4, 17, 64, 100):
        x = torch.randn(rows, 1, 96)
        with torch.inference_mode():
            assert torch.equal(with_bias(x), plain(x) + bias)
    with pytest.raises(ValueError, match="already adds a bias"):
        with_bias.plus_bias(bias)


def test_the_copy_adds_the_output_bias_in_the_projection_with_the_same_bits() -> None:
    model = tiny_model(vocab=40, seed=3, output_bias=True)
    assert model.output_bias is not None
    with torch.no_grad():
        model.output_bias.normal_()
        model.output_bias[5] = float("-inf")
    twin = onednn(model)
    assert twin.projection_adds_bias and not model.projection_adds_bias
    assert isinstance(twin.projection, OneDNNLinear) and twin.projection.bias is not None
    # the same copy with the bias added after the product, as before
    after = onednn(model)
    after.projection = OneDNNLinear(model.output_weight)
    g = torch.Generator().manual_seed(0)
    src = pad_batch([torch.randint(6, 40, (int(n),), generator=g).tolist() + [EOS] for n in (3, 7, 5)])
    with torch.inference_mode():
        assert torch.equal(twin(src, src[:, :4]), after(src, src[:, :4]))
        # a shortlist's rows of the projection add their own bias once
        ids = torch.tensor([2, 5, 9, 30])
        hidden = twin.hidden(src, src[:, :4])
        assert torch.equal(output_rows(twin, ids)(hidden), twin(src, src[:, :4])[..., ids])
    found = [beam_search(m, src, beam=3, alpha=0.6, max_len=torch.full((3,), 6)) for m in (twin, after)]
    assert [[(h.tokens, h.score) for h in a] for a in found[0]] == [[(h.tokens, h.score) for h in a]
                                                                    for a in found[1]]


def test_the_block_size_is_the_environments_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = torch.randn(300, 96) / 9
    x = torch.randn(5, 96)
    monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", 300 * 96 * 4 // 4)
    default = OneDNNLinear(weight)
    monkeypatch.setenv("SEQTRANS_PACK_BLOCK_MIB", "0")  # one block per weight
    whole = OneDNNLinear(weight)
    assert len(default.packed_weights) == 4 and len(whole.packed_weights) == 1
    with torch.inference_mode():
        assert torch.equal(default(x), whole(x))  # the blocks' sums are the whole product's
    monkeypatch.setenv("SEQTRANS_PACK_BLOCK_MIB", "1")  # 1 MiB: this weight's 112.5 KiB in one
    assert len(OneDNNLinear(weight).packed_weights) == 1
    monkeypatch.delenv("SEQTRANS_PACK_BLOCK_MIB")
    for block, count in ((300 * 96 * 4 // 2, 1), (300 * 96 * 4 // 2 - 4, 3)):  # two blocks' bytes: whole
        monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", block)
        assert len(OneDNNLinear(weight).packed_weights) == count
    for bad in ("-1", "1.5", "lots"):
        monkeypatch.setenv("SEQTRANS_PACK_BLOCK_MIB", bad)
        with pytest.raises(UsageError, match=f"SEQTRANS_PACK_BLOCK_MIB must be a whole number.*{bad!r}"):
            OneDNNLinear(weight)


def _through_onednn(layer: OneDNNLinear) -> OneDNNLinear:
    """The same layer (the same packed copy) with every product through oneDNN's call."""
    other = OneDNNLinear(layer.weight, layer.bias, packed_weight=layer._packed)
    other._native = False
    return other


@pytest.mark.parametrize("shape", [(48, 64), (301, 96), (512, 512), (70, 1536), (1024, 2048)])
@pytest.mark.parametrize("blocks", [1, 3])
def test_a_steps_few_rows_get_onednns_bits_from_the_native_kernel(shape: tuple[int, int], blocks: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to NATIVE_ROWS rows go through the native kernel, which reads oneDNN's packed copy
    and must give each output oneDNN's bits (sums in chunks of 1,024 inputs past 1,024, the
    bias, relu, blocks of the weight written in place in their columns)."""
    if blocks > 1:
        monkeypatch.setattr(onednn_module, "PACK_BLOCK_BYTES", shape[0] * shape[1] * 4 // blocks)
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(*shape, generator=g), torch.randn(shape[0], generator=g)
    for bias in (b, None):
        layer = OneDNNLinear(w, bias)
        reference = _through_onednn(layer)
        for lead in ((1,), (2,), (3, 1), (4,), (5,), (8, 1), (2, 4)):
            x = torch.randn(*lead, shape[1], generator=g)
            for relu in (False, True):
                with torch.inference_mode():
                    y = layer(x, relu=relu)
                assert y.shape == (*lead, shape[0]) and y.is_contiguous()
                assert torch.equal(y, reference(x, relu=relu)), (lead, relu)
        packed_for_avx2 = native.packed_linear_available() and "avx512f" not in cpu_features()
        if packed_for_avx2 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            assert layer._native, "oneDNN packs these shapes for AVX2 as the kernel reads them"


def test_the_native_kernel_takes_more_rows_than_it_sums_at_once() -> None:
    """The kernel sums 16 rows at a time; more rows in one call are summed in turn, each
    with oneDNN's bits."""
    g = torch.Generator().manual_seed(11)
    layer = OneDNNLinear(torch.randn(128, 64, generator=g), torch.randn(128, generator=g))
    x = torch.randn(37, 64, generator=g)
    if not layer._check_native():
        pytest.skip("the native kernel does not read this processor's packing")
    assert torch.equal(layer._native_product(x, relu=True), _through_onednn(layer)(x, relu=True))


def test_the_native_kernel_is_used_only_where_it_gives_onednns_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that sums otherwise (here: one output a float step off) fails the layer's
    check, and every product goes through oneDNN."""
    real = native.packed_linear_unchecked

    def off_by_a_step(x: torch.Tensor, *args: object, **kwargs: object) -> None:
        real(x, *args, **kwargs)  # type: ignore[arg-type]
        out = args[3]
        assert isinstance(out, torch.Tensor)
        out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf")))

    monkeypatch.setattr(native, "packed_linear_unchecked", off_by_a_step)
    g = torch.Generator().manual_seed(8)
    layer = OneDNNLinear(torch.randn(64, 64, generator=g), torch.randn(64, generator=g))
    x = torch.randn(4, 64, generator=g)
    y = layer(x)
    assert layer._native is False
    assert torch.equal(y, _through_onednn(layer)(x))
    assert torch.equal(y[:1], layer(x[:1]))


def test_a_packing_the_kernel_does_not_read_keeps_onednns_call() -> None:
    """Where oneDNN packs a weight otherwise than in blocks of 64 outputs by K (its size
    says so), the kernel never reads it."""
    g = torch.Generator().manual_seed(9)
    layer = OneDNNLinear(torch.randn(40, 24, generator=g))
    x = torch.randn(3, 24, generator=g)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    block = layer.packed_weights[0]
    if block.is_mkldnn and torch.ops.mkldnn._nbytes(block) != 64 * 24 * 4:
        assert layer._native is False
