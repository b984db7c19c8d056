"""int8 decoding: hand-computed quantization, the error bound of the integer product,
a decoding copy that leaves the model alone, and decoding close to fp32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import decoding_copy, tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS
from seqtrans.decoding.beam import beam_search, greedy_search
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import generate
from seqtrans.errors import ConfigError
from seqtrans.linear import int8 as int8_module
from seqtrans.linear.int8 import Int8Linear, quantize_rows, quantize_weight, row_sums
from seqtrans.linear.quantize import int8_only, is_int8_only, quantized, quantized_cached


def test_rows_quantize_by_their_largest_magnitude_with_ties_to_even() -> None:
    # scales 1, 2 and (a row of zeros) 1: exact in binary, so the ties are real ties
    x = torch.tensor([[127.0, -50.4, 3.6, 0.0], [-254.0, 100.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8
    assert q.tolist() == [[127, -50, 4, 0], [-127, 50, 0, 2], [0, 0, 0, 0]]
    assert scale.view(-1).tolist() == [1.0, 2.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_weight_quantized_in_blocks_has_the_bits_of_its_rows_quantized_at_once(dtype: torch.dtype) -> None:
    """float32 goes through one reused buffer, other types through quantize_rows: either
    way the bits of quantize_rows over the whole matrix, across block edges, with rows of
    zeros and exact ties."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(1003, 40, generator=g) * torch.rand(1003, 1, generator=g) * 9).to(dtype)
    w[0] = 0.0
    w[500] = torch.tensor([127.0, -50.5, 3.5, 0.5] * 10, dtype=dtype)  # scale 1: ties round to even
    q, scale = quantize_weight(w, block=100)
    expected_q, expected_scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert torch.equal(q, expected_q)
    assert torch.equal(scale, expected_scale)
    assert q[500, :4].tolist() == [127, -50, 4, 0]


def test_a_weight_converted_in_place_hands_the_freed_heap_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[None] = []
    monkeypatch.setattr(int8_module, "trim_freed_memory", lambda: calls.append(None))
    w = torch.randn(300, 16)
    kept = quantize_weight(w, block=100)
    assert not calls  # a copy beside the float weight: nothing freed to hand back
    released = quantize_weight(w, block=100, release=True)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(kept, released))


def test_row_sums_are_an_int8_matrix_summed_in_int32() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-127, 128, (1003, 300), generator=g, dtype=torch.int8)
    q[5] = 127  # 38,100: past int8 and int16
    sums = row_sums(q, block=100)
    assert sums.dtype == torch.int32 and torch.equal(sums, q.to(torch.int64).sum(dim=1).to(torch.int32))


@pytest.mark.parametrize("unsigned", [False, True])
def test_int8_linear_equals_hand_computed_quantize_matmul_dequantize(unsigned: bool) -> None:
    # W rows: scale 1 -> [127, -1]; scale 2 -> [127, -2] (-1.5 ties to even)
    # x rows: scale 1 -> [127, 10]; scale 0.5 -> [-127, 0]
    layer = Int8Linear(torch.tensor([[127.0, -1.0], [254.0, -3.0]]), torch.tensor([0.25, -1.0]),
                       unsigned=unsigned)
    assert layer.qweight.tolist() == [[127, -1], [127, -2]]
    y = layer(torch.tensor([[127.0, 10.0], [-63.5, 0.1]]))
    expected = [[(127 * 127 - 10) * 1 * 1 + 0.25, (127 * 127 - 20) * 1 * 2 - 1.0],
                [-127 * 127 * 0.5 * 1 + 0.25, -127 * 127 * 0.5 * 2 - 1.0]]
    assert y.tolist() == expected


def test_int8_linear_matches_an_integer_reference_and_stays_within_its_error_bound() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 256, generator=g), torch.randn(48, generator=g)
    x = torch.randn(2, 5, 256, generator=g) * torch.linspace(0.01, 10, 5)[:, None]  # rows of any size
    layer = Int8Linear(w, b)
    y = layer(x)  # [2, 5, 48]
    assert y.shape == (2, 5, 48)
    # unsigned activations with the compensation give the very same numbers
    assert torch.equal(Int8Linear(w, b, unsigned=not layer.unsigned)(x), y)
    # the integer product is exact: the same as int64 arithmetic
    xq, xs = quantize_rows(x.reshape(10, 256))
    exact = (xq.long() @ layer.qweight.long().t()).double() * xs.double() * layer.scale.double() + b.double()
    torch.testing.assert_close(y.reshape(10, 48).double(), exact, rtol=1e-6, atol=1e-5)
    # against fp32: each factor is off by at most half its scale per element
    x2 = x.reshape(10, 256)
    bound = (0.5 * layer.scale * x2.abs().sum(1, keepdim=True) + 0.5 * xs * w.abs().sum(1)
             + 0.25 * xs * layer.scale * 256)  # [10, 48]
    error = (y.reshape(10, 48) - F.linear(x2, w, b)).abs()
    assert (error <= bound * 1.001 + 1e-5).all()
    assert error.norm() < 0.02 * F.linear(x2, w).norm()


@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_int8_linear_takes_any_shape_on_the_cpu(rows: int, unsigned: bool) -> None:
    # torch._int_mm on CUDA wants sizes in multiples of 8; the CPU kernel takes any
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(9, 7, generator=g), torch.randn(rows, 7, generator=g)
    layer = Int8Linear(w, unsigned=unsigned)
    xq, xs = quantize_rows(x)
    expected = (xq.long() @ layer.qweight.long().t()).double() * xs.double() * layer.scale.double()
    torch.testing.assert_close(layer(x).double(), expected, rtol=1e-6, atol=1e-6)


def test_the_decoding_copy_leaves_the_model_and_its_tensors_alone() -> None:
    model, twin = decoding_copy(quantized, Int8Linear)
    # tied embeddings: the projection quantizes the embedding matrix, the lookup stays fp32
    assert twin.projection is not None and twin.projection.weight is model.target_embed.weight
    assert twin.target_embed.weight is model.target_embed.weight
    src = pad_batch([[4, 5, 6, EOS], [7, EOS]])
    with torch.no_grad():
        torch.testing.assert_close(twin.encode(src).memory, model.encode(src).memory, rtol=0.1, atol=0.1)


def test_an_untied_output_layer_is_quantized_as_the_projection() -> None:
    model = tiny_model(vocab=11, seed=2, tie_output=False)
    twin = quantized(model)
    assert model.output is not None and isinstance(twin.projection, Int8Linear)
    assert twin.projection.weight is model.output.weight


def test_int8_decoding_is_close_to_fp32() -> None:
    """Random tiny models say much the same thing for every source, so the test asks more of
    the scores than of the outputs: teacher-forced log-probabilities within 0.15, greedy
    outputs the same for most sources, and scores of equal outputs within 0.2."""
    g = torch.Generator().manual_seed(0)
    sources = [torch.randint(4, 40, (int(n),), generator=g).tolist() + [EOS]
               for n in torch.randint(3, 9, (20,), generator=g)]
    src = pad_batch(sources)
    for seed in (0, 1):
        model = tiny_model(vocab=40, seed=seed, d_model=32, d_ff=64)
        twin = quantized(model)
        with torch.no_grad():
            tgt = src[:, :6]
            diff = model(src, tgt).log_softmax(-1) - twin(src, tgt).log_softmax(-1)
        assert diff.abs().max() < 0.15
        max_len = torch.full((20,), 8)
        for beam in (1, 4):
            if beam == 1:
                ours = greedy_search(model, src, max_len=max_len)
                theirs = greedy_search(twin, src, max_len=max_len)
            else:
                ours = beam_search(model, src, beam=beam, alpha=0.6, max_len=max_len)
                theirs = beam_search(twin, src, beam=beam, alpha=0.6, max_len=max_len)
            same = [(a[0], b[0]) for a, b in zip(ours, theirs) if a[0].tokens == b[0].tokens]
            assert len(same) >= 17
            assert all(abs(a.score - b.score) < 0.2 for a, b in same)


def test_generate_with_int8_decodes_with_the_quantized_copy() -> None:
    model = tiny_model(vocab=11, seed=1)
    sources = [[4, 5, 6, 7, 8, 9, EOS], [9, 8, 7, EOS]]
    config = DecodeConfig(beam=3, max_len_b=4, precision="int8")
    out = generate(model, sources, config, device=torch.device("cpu"))
    twin = quantized(model)
    for src, hyps in zip(sources, out):
        single = beam_search(twin, pad_batch([src]), beam=3, alpha=config.alpha,
                             max_len=torch.tensor([len(src) - 1 + 4]))[0]
        assert [(h.tokens, h.score) for h in hyps] == [(h.tokens, h.score) for h in single]


def test_generate_with_int8_quantizes_every_member_of_an_ensemble() -> None:
    members = [tiny_model(vocab=11, seed=s) for s in (1, 2)]
    sources = [[4, 5, 6, 7, 8, 9, EOS], [9, 8, 7, EOS]]
    config = DecodeConfig(beam=3, max_len_b=4, precision="int8")
    out = generate(Ensemble(members, [1.0, 3.0]), sources, config, device=torch.device("cpu"))
    twin = Ensemble([quantized(m) for m in members], [1.0, 3.0])
    for src, hyps in zip(sources, out):
        single = beam_search(twin, pad_batch([src]), beam=3, alpha=config.alpha,
                             max_len=torch.tensor([len(src) - 1 + 4]))[0]
        assert [(h.tokens, h.score) for h in hyps] == [(h.tokens, h.score) for h in single]
    assert all(isinstance(m.decoder_layers[0].ffn.inner, nn.Linear) for m in members)  # left alone


def test_int8_off_the_cpu_and_unknown_precisions_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="decode.precision.*fp32, bf16, int8.*'int4'"):
        DecodeConfig(precision="int4")
    with pytest.raises(ConfigError, match="decode.precision.*CPU only"):
        quantized(tiny_model().to("meta"))


@pytest.mark.gpu
def test_int8_on_cuda_is_a_config_error() -> None:
    model = tiny_model().cuda()
    with pytest.raises(ConfigError, match="CPU only"):
        generate(model, [[4, 5, EOS]], DecodeConfig(precision="int8"), device=torch.device("cuda"))


def test_the_int8_copy_is_made_once_and_again_only_when_the_weights_change() -> None:
    model = tiny_model(vocab=11, seed=1)
    first = quantized_cached(model)
    assert quantized_cached(model) is first  # decoding line after line quantizes once
    sources = [[4, 5, 6, 7, 8, 9, EOS]]
    config = DecodeConfig(beam=3, max_len_b=4, precision="int8")
    before = generate(model, sources, config, device=torch.device("cpu"))
    with torch.no_grad():  # as an optimizer step does: in place
        model.output_weight.mul_(-1.0)
    second = quantized_cached(model)
    assert second is not first
    assert torch.equal(second.projection.qweight, quantized(model).projection.qweight)
    assert torch.equal(second.projection.qweight, -first.projection.qweight)
    after = generate(model, sources, config, device=torch.device("cpu"))
    assert [h.score for h in after[0]] != [h.score for h in before[0]]


def _tensor_bytes(model: nn.Module) -> dict[int, int]:
    """The storages a module holds (parameters, buffers, and the float weights an int8
    layer may keep a reference to): data pointer -> bytes."""
    held = {t.data_ptr(): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    for module in model.modules():
        for name in ("weight", "bias"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor):
                held[t.data_ptr()] = t.numel() * t.element_size()
    return held


@pytest.mark.parametrize("tie_output", [True, False])
def test_an_int8_only_model_computes_as_the_int8_copy_with_its_tables_quantized(tie_output: bool) -> None:
    """int8_only differs from the shared int8 copy only in its embedding tables: against
    that copy of a model whose tables hold their own dequantized int8 rows, equal logits."""
    model = tiny_model(vocab=40, seed=3, d_model=32, d_ff=64, tie_output=tie_output)
    alone = int8_only(model)
    assert is_int8_only(alone) and not is_int8_only(model)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        q, s = quantize_rows(reference.target_embed.weight)
        reference.target_embed.weight.copy_(q.float() * s)
    src = pad_batch([[4, 5, 6, 7, EOS], [9, 30, EOS]])
    tgt = src[:, :4]
    with torch.no_grad():
        expected = quantized(reference)(src, tgt)
        torch.testing.assert_close(alone(src, tgt), expected, rtol=0, atol=0)
        assert int8_only(model, in_place=True) is model  # what loading does: the same model
        torch.testing.assert_close(model(src, tgt), expected, rtol=0, atol=0)
    assert quantized(alone) is alone and quantized_cached(alone) is alone


def test_an_int8_only_model_holds_no_float_copy_of_the_weights() -> None:
    model = tiny_model(vocab=500, seed=0, d_model=64, d_ff=256)
    float_held, int8_held = _tensor_bytes(model), _tensor_bytes(int8_only(model))
    big = {ptr for ptr, n in float_held.items() if n >= 64 * 64 * 4}  # the weight matrices
    assert big and not big & set(int8_held)
    assert sum(int8_held.values()) < 0.3 * sum(float_held.values())


def test_new_decoding_states_take_the_float_type_of_a_model_without_float_weights() -> None:
    model = tiny_model(vocab=11, seed=1, causal_encoder=True)
    assert model.float_like() is model.target_embed.weight
    alone = int8_only(model)
    like = alone.float_like()
    assert like.dtype == torch.float32 and alone.device == torch.device("cpu")
    assert alone.start_encoding().caches[0].k.dtype == torch.float32


def test_an_int8_only_model_refuses_float_precisions_by_name() -> None:
    alone = int8_only(tiny_model(vocab=11, seed=1))
    for precision in ("fp32", "bf16"):
        with pytest.raises(ConfigError, match=rf"decode\.precision.*{precision} needs the float weights"):
            generate(alone, [[4, 5, EOS]], DecodeConfig(precision=precision), device=torch.device("cpu"))
    config = DecodeConfig(precision="int8", max_len_b=3)
    assert generate(alone, [[4, 5, EOS]], config, device=torch.device("cpu"))[0][0].tokens


@pytest.mark.parametrize("unsigned", [True, False])
def test_a_bias_added_by_the_int8_layer_is_the_bias_added_after_bit_for_bit(unsigned: bool) -> None:
    torch.manual_seed(0)
    plain = Int8Linear(torch.randn(70, 48) * 0.1, unsigned=unsigned)
    bias = torch.randn(70) * 4
    bias[3] = float("-inf")
    with_bias = plain.plus_bias(bias)
    assert with_bias.qweight is plain.qweight and with_bias.weight is plain.weight
    assert torch.equal(with_bias.rows(torch.tensor([3, 9]))(torch.ones(2, 48)),
                       plain.rows(torch.tensor([3, 9]))(torch.ones(2, 48)) + bias[[3, 9]])
    for rows in (1, 4, 17, 64):
        x = torch.randn(rows, 48)
        assert torch.equal(with_bias(x), plain(x) + bias)
    with pytest.raises(ValueError, match="already adds a bias"):
        with_bias.plus_bias(bias)


@pytest.mark.parametrize("only", [False, True])
def test_the_int8_projection_adds_the_output_bias_with_the_bits_of_adding_it_after(only: bool) -> None:
    model = tiny_model(vocab=40, seed=3, d_model=32, d_ff=64, output_bias=True, tie_output=False)
    assert model.output_bias is not None
    with torch.no_grad():
        model.output_bias.normal_()
    twin = int8_only(copy.deepcopy(model)) if only else quantized(model)
    assert twin.projection_adds_bias and isinstance(twin.projection, Int8Linear)
    assert twin.projection.bias is not None
    # the same copy with the bias added to the projection's output, as before
    after = int8_only(copy.deepcopy(model)) if only else quantized(model)
    assert isinstance(after.projection, Int8Linear)
    after.projection = Int8Linear(None, unsigned=after.projection.unsigned, keep_float=False,
                                  rows=(after.projection.qweight, after.projection.scale.unsqueeze(1)))
    src = pad_batch([[4, 5, 6, 7, EOS], [9, 30, EOS]])
    with torch.no_grad():
        assert torch.equal(twin(src, src[:, :4]), after(src, src[:, :4]))
