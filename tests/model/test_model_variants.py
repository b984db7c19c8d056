"""The Transformer variants of models trained elsewhere, each a model option (RMSNorm,
relative position biases, gated feed-forward layers, no biases, unscaled attention, heads
of another width, a scaled output): each computes what straightforward reference code
computes, a model with all of them on is causal, independent of its batch mates and
decodes incrementally as it computes whole targets, and leaving them off changes nothing."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_alone_as_among_others, assert_cached_as_full, assert_causal, src_batch, tiny_model
from seqtrans.attention import SelfAttention
from seqtrans.attention.cache import KVCache
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import BOS, EOS
from seqtrans.errors import ConfigError
from seqtrans.linear.int8 import Int8Linear
from seqtrans.linear.quantize import int8_only, quantized
from seqtrans.model.norms import NativeLayerNorm, RMSNorm
from seqtrans.model.relative import RelativePositionBias, relative_buckets
from seqtrans.model.transformer import FeedForward, attention_maps

pytestmark = pytest.mark.usefixtures("no_grad")

#: every variant on at once, as Raffel et al.'s later checkpoints have them (few buckets, so that 12
#: positions reach the log-spaced ones)
VARIANTS = {"norm": "pre", "norm_kind": "rms", "norm_eps": 1e-6, "positions": "relative",
            "relative_buckets": 8, "relative_max_distance": 12, "bias": False, "attention_scale": False,
            "head_dim": 6, "activation": "gelu_tanh", "gated_ffn": True, "scale_embeddings": False,
            "scale_output": True}


def reference_bucket(relative: int, *, bidirectional: bool, buckets: int, max_distance: int) -> int:
    """Raffel et al.'s bucket of one relative position, written out for a single number."""
    offset = 0
    if bidirectional:
        buckets //= 2
        offset = buckets if relative > 0 else 0
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = buckets // 2
    if distance < exact:
        return offset + distance
    log_spaced = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (buckets - exact))
    return offset + min(buckets - 1, log_spaced)


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 12), (64, 256), (10, 40)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_are_those_of_the_reference(buckets: int, max_distance: int,
                                                     bidirectional: bool) -> None:
    relative = torch.arange(-600, 601)
    got = relative_buckets(relative, bidirectional=bidirectional, buckets=buckets, max_distance=max_distance)
    assert got.tolist() == [reference_bucket(r, bidirectional=bidirectional, buckets=buckets,
                                             max_distance=max_distance) for r in relative.tolist()]
    assert int(got.max()) == buckets - 1  # far distances reach the last bucket (of the upper half)


def test_the_position_bias_looks_up_each_pair_of_positions() -> None:
    torch.manual_seed(0)
    bias = RelativePositionBias(3, buckets=8, max_distance=12, bidirectional=False, d_model=16)
    out = bias(2, 9, offset=7)  # queries at positions 7 and 8, keys 0 .. 8
    assert out.shape == (1, 3, 2, 9)
    for i, query in enumerate((7, 8)):
        for key in range(9):
            bucket = reference_bucket(key - query, bidirectional=False, buckets=8, max_distance=12)
            torch.testing.assert_close(out[0, :, i, key], bias.table.weight[bucket])


def test_a_decoding_steps_bias_is_the_lookups_and_follows_the_table() -> None:
    torch.manual_seed(0)
    bias = RelativePositionBias(3, buckets=8, max_distance=12, bidirectional=False, d_model=16)
    with torch.no_grad():
        for offset in (0, 1, 5, 63, 64, 200, 3):  # past the kept distances, then back
            for keys in (offset + 1, max(1, offset - 2)):  # every key so far, or the latest cut off
                got = bias(1, keys, offset=offset)
                assert got.shape == (1, 3, 1, keys)
                for key in range(keys):
                    bucket = reference_bucket(key - offset, bidirectional=False, buckets=8, max_distance=12)
                    assert torch.equal(got[0, :, 0, key], bias.table.weight[bucket])
        bias.table.weight.mul_(2)  # a changed table is looked up again
        first = reference_bucket(-3, bidirectional=False, buckets=8, max_distance=12)
        assert torch.equal(bias(1, 4, offset=3)[0, :, 0, 0], bias.table.weight[first])
        kept = bias._by_distance
        assert kept is not None and kept[1].size(1) == 256  # a changed table: looked up anew, not grown
    with torch.enable_grad():  # with gradients the bias is made anew, so that they reach the table
        bias(1, 6, offset=5).sum().backward()
    assert bias.table.weight.grad is not None and bias.table.weight.grad.abs().sum() > 0
    with torch.inference_mode():  # a table of inference tensors keeps no version: made anew each time
        inferred = RelativePositionBias(3, buckets=8, max_distance=12, bidirectional=False, d_model=16)
        inferred.table.weight.copy_(bias.table.weight)
        assert torch.equal(inferred(1, 6, offset=5), bias(1, 6, offset=5))
        assert inferred._by_distance is None


def test_rms_norm_divides_by_the_root_mean_square_and_scales() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(6, eps=1e-6)
    norm.weight.normal_()
    x = torch.randn(2, 3, 6) * 5 + 2
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert [name for name, _ in norm.named_parameters()] == ["weight"]  # no bias


def test_a_gated_feed_forward_layer_multiplies_by_its_gate() -> None:
    torch.manual_seed(0)
    ffn = FeedForward(8, 12, dropout=0.0, activation="gelu_tanh", gated=True, bias=False)
    assert ffn.gate is not None and ffn.inner.bias is None and ffn.outer.bias is None
    x = torch.randn(3, 8)
    h = x @ ffn.inner.weight.t()
    gelu = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    expected = (gelu * (x @ ffn.gate.weight.t())) @ ffn.outer.weight.t()
    torch.testing.assert_close(ffn(x), expected, atol=1e-6, rtol=1e-5)


def _reference_attention(attn: SelfAttention, x: torch.Tensor, bias: torch.Tensor, allowed: torch.Tensor,
                         ) -> torch.Tensor:
    """softmax(q k^T + bias) v per head, unscaled, with the heads' own width.
    x [N, T, D], bias [1, H, T, T], allowed [N, T, T] -> [N, T, D]"""
    n, t, _ = x.shape
    q, k, v = (part.view(n, t, attn.heads, -1).transpose(1, 2) for part in attn.qkv(x).chunk(3, dim=-1))
    scores = q @ k.transpose(-1, -2) + bias  # [N, H, T, T]
    weights = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    return attn.out((weights @ v).transpose(1, 2).reshape(n, t, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_a_position_bias_and_narrow_heads_equals_the_reference(causal: bool) -> None:
    torch.manual_seed(0)
    attn = SelfAttention(16, 3, head_dim=5, bias=False, scaled=False, relative=True).eval()
    assert attn.qkv.weight.shape == (45, 16) and attn.out.weight.shape == (16, 15) and attn.qkv.bias is None
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    bias = RelativePositionBias(3, buckets=8, max_distance=12, bidirectional=not causal, d_model=16)(5, 5)
    allowed = mask[:, None, :].expand(2, 5, 5)
    if causal:
        allowed = allowed & torch.ones(5, 5, dtype=torch.bool).tril()
    expected = _reference_attention(attn, x, bias, allowed)
    # decoding on the CPU (each sentence on its own), and a training pass (one masked call)
    torch.testing.assert_close(attn(x, mask=mask, causal=causal, position_bias=bias), expected)
    with torch.enable_grad():
        torch.testing.assert_close(attn(x, mask=mask, causal=causal, position_bias=bias), expected)
    # one query at a time against a cache: the native kernel's (which adds the bias) where
    # it is built, and PyTorch's
    if causal:
        rel = RelativePositionBias(3, buckets=8, max_distance=12, bidirectional=False, d_model=16)
        rel.load_state_dict({"table.weight": torch.randn(8, 3)})
        full = attn(x, causal=True, position_bias=rel(5, 5))
        for cache in (attn.new_cache(2, 2, like=x), KVCache(2, 3, 5, 2, dtype=x.dtype, device=x.device)):
            steps = [attn(x[:, t: t + 1], causal=True, cache=cache, position_bias=rel(1, t + 1, offset=t))
                     for t in range(5)]
            torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_unscaled_attention_leaves_the_logits_as_they_are() -> None:
    torch.manual_seed(0)
    scaled = SelfAttention(16, 4).eval()
    unscaled = SelfAttention(16, 4, scaled=False).eval()
    unscaled.load_state_dict(scaled.state_dict())
    with torch.no_grad():  # q scaled by sqrt(d) up front: the scaled attention of the unscaled logits
        scaled.qkv.weight[:16] *= 2.0
        scaled.qkv.bias[:16] *= 2.0
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(unscaled(x), scaled(x))
    torch.testing.assert_close(unscaled.weights(x), scaled.weights(x))


def test_every_variant_keeps_the_model_causal_and_independent_of_its_batch_mates() -> None:
    model = tiny_model(seed=1, **VARIANTS)
    assert_causal(model)
    assert_alone_as_among_others(model)


@pytest.mark.parametrize("variants", [VARIANTS, {**VARIANTS, "positions": "sinusoidal"},
                                      {"attention_scale": False, "head_dim": 6}],
                         ids=["all", "absolute-positions", "native-attention"])
def test_incremental_decoding_of_the_variants_equals_teacher_forcing(native_kernels: None,
                                                                     variants: dict) -> None:
    """Beyond the position bias's reach (relative_max_distance 12, 14 target positions),
    one token at a time, several at once, and the native kernels' path where no bias is
    added (every model on the CPU in float32 goes through it)."""
    model = tiny_model(**variants)
    src = torch.cat([src_batch(), torch.tensor([[5, 6, 7, 8, 9, 10, 4, 5, 6, 7, 8, 9, 10, EOS]])[:, :5]])
    tgt = torch.randint(4, 11, (3, 14), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = BOS
    assert_cached_as_full(model, src, tgt, split=5)


def test_the_scaled_output_is_what_the_projection_reads() -> None:
    plain, scaled = tiny_model(seed=3), tiny_model(seed=3, scale_output=True)
    src, tgt = src_batch(), torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    torch.testing.assert_close(scaled(src, tgt), plain(src, tgt) * 16**-0.5)


def test_a_causal_encoder_with_relative_positions_encodes_incrementally() -> None:
    model = tiny_model(causal_encoder=True, positions="relative", relative_buckets=8, relative_max_distance=6)
    src = torch.tensor([[5, 6, 7, 8, 9, 4, 5, 6, 7, 8, EOS]])
    whole = model.encode(src).memory
    state = model.start_encoding(capacity=2)
    parts = [model.encode_next(src[:, a:b], state) for a, b in ((0, 1), (1, 4), (4, 11))]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_attention_maps_of_a_relative_model_include_the_bias() -> None:
    model = tiny_model(**VARIANTS)
    src, tgt = src_batch(), torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    maps = attention_maps(model, src, tgt)
    layer = model.encoder_layers[0]
    assert model.relative_bias is not None
    h = layer.r1.input(model._embed(model.source_embed, src, 0, source=True))
    expected = layer.self_attn.weights(h, mask=src.ne(0), position_bias=model.relative_bias(5, 5))
    torch.testing.assert_close(maps.encoder[0], expected)
    torch.testing.assert_close(maps.encoder[0].sum(-1), torch.ones(2, 4, 5))


def test_the_variants_off_build_the_same_model() -> None:
    plain = tiny_model()
    names = set(plain.state_dict())
    assert not any("relative" in n or "gate" in n for n in names)
    on = set(tiny_model(**VARIANTS).state_dict())
    assert {"relative_bias.table.weight", "decoder_relative_bias.table.weight",
            "encoder.0.ffn.gate.weight"} <= on
    assert not any(n.endswith(".bias") for n in on) and "positions.table.weight" not in on
    again = tiny_model(norm_kind="layer", norm_eps=1e-5, bias=True, attention_scale=True, head_dim=4)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in plain.state_dict().items())
    src, tgt = src_batch(), torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    assert torch.equal(again(src, tgt), plain(src, tgt))


@pytest.mark.parametrize("options, key", [
    ({"positions": "relative", "encoder_attention": "restricted"}, "model.positions"),
    ({"head_dim": 8, "cross_attention": "monotonic"}, "model.head_dim"),
    ({"bias": False, "decoder_attention": "dot"}, "model.bias"),
    ({"attention_scale": False, "cross_attention": "local"}, "model.attention_scale"),
    ({"relative_buckets": 2}, "model.relative_buckets"),
    ({"relative_buckets": 32, "relative_max_distance": 16}, "model.relative_max_distance"),
    ({"norm_eps": 0.0}, "model.norm_eps"),
    ({"head_dim": -1}, "model.head_dim"),
])
def test_variants_that_cannot_be_built_are_refused_by_name(options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ModelConfig(**options)


def test_heads_need_not_divide_the_width_with_their_own() -> None:
    model = tiny_model(d_model=18, heads=4, head_dim=5)
    assert model.encoder_layers[0].self_attn.qkv.weight.shape == (60, 18)
    assert model(src_batch(), torch.tensor([[BOS, 4], [BOS, 5]])).shape == (2, 2, 11)
    with pytest.raises(ConfigError, match="model.heads"):
        ModelConfig(d_model=18, heads=4)


def test_gelu_tanh_is_the_tanh_approximation() -> None:
    x = torch.linspace(-4, 4, 81)
    ffn = FeedForward(1, 1, dropout=0.0, activation="gelu_tanh")
    torch.testing.assert_close(ffn.activation(x), F.gelu(x, approximate="tanh"))


def test_int8_decoding_copies_of_the_variants_quantize_every_layer_and_stay_close() -> None:
    model = tiny_model(vocab=40, seed=0, d_model=32, d_ff=64, **VARIANTS)
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11, EOS], [9, 30, 12, EOS, 0, 0, 0, 0, 0]])
    tgt = torch.cat([torch.full((2, 1), BOS), src[:, :6]], dim=1)
    expected = model(src, tgt).log_softmax(-1)
    for twin in (quantized(model), int8_only(copy.deepcopy(model))):
        assert isinstance(twin.encoder_layers[0].ffn.gate, Int8Linear)
        assert not any(type(m) is torch.nn.Linear for m in twin.modules())
        assert (twin(src, tgt).log_softmax(-1) - expected).abs().max() < 0.15


def test_the_native_layer_norm_is_within_rounding_of_pytorchs_and_a_row_gets_its_bits_in_any_batch(
        native_kernels: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    for width in (7, 32, 512, 1000):
        plain = torch.nn.LayerNorm(width, eps=1e-5)
        torch.nn.init.normal_(plain.weight)
        torch.nn.init.normal_(plain.bias)
        norm = NativeLayerNorm(plain)
        assert norm.weight is plain.weight and norm.bias is plain.bias
        x = torch.randn(3, 5, width) * 4 + 1
        ours, theirs = norm(x), plain(x)  # (the module's tests run without gradients)
        exact = F.layer_norm(x.double(), (width,), plain.weight.double(), plain.bias.double(), 1e-5)
        assert not torch.equal(ours, theirs) or width < 32  # its own sums: another rounding
        # as near the exact value as PyTorch's own rounding is
        worst = (theirs.double() - exact).abs().max().item()
        assert (ours.double() - exact).abs().max().item() <= 4 * worst + 1e-7
        assert torch.equal(norm(x[1, 2:3]), ours[1, 2:3])  # a row alone: the same bits
        assert torch.equal(norm(x.transpose(0, 1)), ours.transpose(0, 1))  # rows not contiguous
        # with gradients (training), or without the kernels: PyTorch's
        with torch.enable_grad():
            assert torch.equal(norm(x), theirs) and norm(x).requires_grad
        monkeypatch.setenv("SEQTRANS_NATIVE", "0")
        assert torch.equal(norm(x), theirs)
        monkeypatch.delenv("SEQTRANS_NATIVE")


def test_rms_norm_in_float32_is_its_formula_bit_for_bit() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 64) * 3
    expected = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(norm(x), expected)
