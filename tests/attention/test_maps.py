"""Attention weights as data (``Transformer.attention_maps``): proper distributions for
every mechanism (and asking for them changes nothing), scaled dot-product weights against
a hand computation, the weights mechanisms report are the ones their forward pass uses."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from test_mechanisms import CASES, build
from torch import Tensor, nn

from conftest import src_batch, tiny_model
from seqtrans.attention.maps import MemoryWeights, MonotonicWeights, NoAttentionWeights, Recorder
from seqtrans.attention.memory import MemoryAttention
from seqtrans.attention.monotonic import MonotonicAttention
from seqtrans.attention.restricted import RestrictedSelfAttention
from seqtrans.attention.scaled_dot import SelfAttention
from seqtrans.data.vocab import BOS, PAD
from seqtrans.model.transformer import attention_maps

pytestmark = pytest.mark.usefixtures("no_grad")

SRC = src_batch()  # [2, 5], the second source padded after 3 tokens
TGT = torch.tensor([[BOS, 5, 6, 7], [BOS, 9, 4, 8]])  # [2, 4]
REAL = SRC.ne(PAD)  # [2, 5]


def hand_softmax(x: Tensor, w: Tensor, b: Tensor, y: Tensor, w_k: Tensor, b_k: Tensor, heads: int,
                 allowed: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(d)) head by head, row by row, with Q = x W^T + b, K = y W_k^T + b_k.
    x [T, D], y [S, D], allowed [T, S] -> [H, T, S]"""
    q, k = x @ w.t() + b, y @ w_k.t() + b_k
    d = q.size(-1) // heads
    out = torch.zeros(heads, x.size(0), y.size(0))
    for h in range(heads):
        qh, kh = q[:, h * d:(h + 1) * d], k[:, h * d:(h + 1) * d]
        for i in range(x.size(0)):
            keys = [j for j in range(y.size(0)) if allowed[i, j]]
            scores = torch.stack([qh[i] @ kh[j] / math.sqrt(d) for j in keys])
            out[h, i, keys] = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
    return out


def test_scaled_dot_weights_equal_a_hand_computation() -> None:
    model = tiny_model()
    maps = attention_maps(model, SRC, TGT)
    d_model, heads = model.config.d_model, model.config.heads
    for b in range(2):
        # the first encoder layer reads the embedded source (post-norm: as it is)
        x = model.source_embed(SRC[b]) * math.sqrt(d_model) + model.positions(5, device=SRC.device)
        attn = model.encoder_layers[0].self_attn
        assert isinstance(attn, SelfAttention)
        w, bias = attn.qkv.weight, attn.qkv.bias
        allowed = REAL[b].expand(5, 5)
        expected = hand_softmax(x, w[:d_model], bias[:d_model], x, w[d_model:2 * d_model],
                                bias[d_model:2 * d_model], heads, allowed)
        torch.testing.assert_close(maps.encoder[0][b], expected, atol=1e-5, rtol=1e-5)

        # the first decoder layer's cross-attention reads the output of its self-attention
        layer = model.decoder_layers[0]
        y = model.target_embed(TGT[b:b + 1]) * math.sqrt(d_model) + model.positions(4, device=SRC.device)
        h = layer.r1(y, layer.self_attn(y, causal=True))[0]  # [T, D]
        memory = model.encode(SRC).memory[b]  # [S, D]
        cross = layer.cross_attn
        kv_w, kv_b = cross.kv.weight[:d_model], cross.kv.bias[:d_model]  # type: ignore[union-attr]
        expected = hand_softmax(h, cross.q.weight, cross.q.bias, memory, kv_w, kv_b,  # type: ignore[union-attr]
                                heads, REAL[b].expand(4, 5))
        torch.testing.assert_close(maps.cross[0][b], expected, atol=1e-5, rtol=1e-5)  # type: ignore[index]


def check_rows(weights: Tensor, allowed: Tensor, rows: Tensor | None = None) -> None:
    """Rows (those where ``rows`` is True) sum to 1 over the allowed keys; zero elsewhere.  [.., Q, K]"""
    allowed = allowed.expand_as(weights)
    assert torch.all(weights[~allowed] == 0)
    assert torch.all(weights >= 0)
    sums = weights.sum(-1)
    if rows is not None:  # a padded query may have nothing in reach (restricted attention)
        sums = sums[rows.expand_as(sums)]
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


@pytest.mark.parametrize("options", CASES)
def test_weights_are_distributions_over_what_may_be_attended(options: dict[str, Any]) -> None:
    model = build(options)
    plain = model.decode_hidden(TGT, model.encode(SRC))
    record = Recorder()
    recorded = model.decode_hidden(TGT, model.encode(SRC, record=record), record=record)
    assert torch.equal(plain, recorded)  # asking for the weights changes nothing
    maps = record.maps()
    assert len(maps.encoder) == len(maps.decoder) == len(maps.cross) == 2
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    for w in maps.encoder:
        assert w.shape == (2, 4, 5, 5)
        check_rows(w, REAL[:, None, None, :], REAL[:, None, :])
    for w in maps.decoder:
        assert w.shape == (2, 4, 4, 4)
        check_rows(w, causal)
    for w in maps.cross:
        if isinstance(w, MemoryWeights):
            assert w.contexts.shape == (2, 4, 3) and w.source.shape == (2, 3, 5)
            assert torch.all(w.source[~REAL[:, None, :].expand(2, 3, 5)] == 0)
            if options.get("memory_decoder_score", "softmax") == "softmax":
                check_rows(w.contexts, torch.ones(1, dtype=torch.bool))
            if options.get("memory_encoder_score", "softmax") == "softmax":
                check_rows(w.source, REAL[:, None, :])
        elif isinstance(w, MonotonicWeights):
            assert w.positions.shape == (2, 4) and w.expected.shape == (2, 4, 5)
            assert torch.all(w.positions.diff(dim=1) >= 0)  # never moves back
            assert torch.all(w.positions <= REAL.sum(1, keepdim=True))
            assert torch.all(w.expected[~REAL[:, None, :].expand(2, 4, 5)] == 0)
            assert torch.all(w.expected.sum(-1) <= 1 + 1e-5)
        else:
            assert w.shape == (2, 4, 4, 5)
            if options.get("local_alignment") is None:  # local attention's windows may be empty
                check_rows(w, REAL[:, None, None, :])
            else:
                assert torch.all(w[~REAL[:, None, None, :].expand_as(w)] == 0)


def test_monotonic_hard_alignment_is_where_decoding_attends() -> None:
    model = build({"cross_attention": "monotonic", "monotonic_r_init": 0.3})
    maps = attention_maps(model, SRC, TGT)
    state = model.start(model.encode(SRC), capacity=8)
    for i in range(TGT.size(1)):  # one step at a time, as decoding does
        model.decode(TGT[:, i:i + 1], state=state)
        for layer, w in zip(state.cross, maps.cross):
            assert isinstance(w, MonotonicWeights)
            assert torch.equal(layer.position, w.positions[:, i])  # type: ignore[attr-defined]
    moved = torch.cat([w.positions for w in maps.cross if isinstance(w, MonotonicWeights)])
    assert moved.unique().numel() > 2  # the case is not trivial: several positions are attended


def test_memory_weights_give_the_memory_attention_output() -> None:
    torch.manual_seed(0)
    attn = MemoryAttention(8, slots=3, positions=True)
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    w = attn.weights(x, memory, REAL)
    contexts = w.source @ memory  # [B, M, D]: C_k = sum_s alpha_ks h_s
    expected = w.contexts @ contexts @ attn.out.weight.t() + attn.out.bias
    torch.testing.assert_close(attn(x, attn.prepare(memory, REAL)), expected, atol=1e-5, rtol=1e-5)


def test_restricted_weights_are_the_full_weights_renormalised_within_the_window() -> None:
    torch.manual_seed(0)
    attn = RestrictedSelfAttention(8, 2, radius=1)
    x = torch.randn(2, 5, 8)
    full = SelfAttention.weights(attn, x, mask=REAL)  # the same projections, every key
    pos = torch.arange(5)
    band = (pos[None] - pos[:, None]).abs() <= 1
    expected = full * band
    expected = (expected / expected.sum(-1, keepdim=True)).nan_to_num(0.0)  # a window of padding only
    torch.testing.assert_close(attn.weights(x, mask=REAL), expected, atol=1e-6, rtol=1e-5)
    # and they are what its forward pass mixes the values with
    v = attn.qkv(x).chunk(3, dim=-1)[2].view(2, 5, 2, 4).transpose(1, 2)  # [N, H, T, d]
    mixed = (attn.weights(x, mask=REAL) @ v).transpose(1, 2).reshape(2, 5, 8)
    torch.testing.assert_close(attn(x, mask=REAL), attn.out(mixed), atol=1e-5, rtol=1e-5)


def test_a_module_without_weights_says_so() -> None:
    record = Recorder(memory=torch.zeros(1, 2, 4), mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(NoAttentionWeights, match="Linear does not report its attention weights"):
        record.encoder_self(nn.Linear(4, 4), torch.zeros(1, 2, 4), mask=None, causal=False)
    with pytest.raises(NoAttentionWeights, match="Linear does not report"):
        record.encoder_decoder(nn.Linear(4, 4), torch.zeros(1, 2, 4))


def test_monotonic_weights_without_energy_above_zero_attend_nothing() -> None:
    torch.manual_seed(0)
    attn = MonotonicAttention(8, r_init=-50.0)  # p = sigmoid(e) ~ 0 everywhere
    w = attn.weights(torch.randn(2, 3, 8), torch.randn(2, 5, 8), REAL)
    assert torch.equal(w.positions, REAL.sum(1, keepdim=True).expand(2, 3))
