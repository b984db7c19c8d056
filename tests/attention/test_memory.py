"""Memory attention (Britz et al. 2017) against a direct computation of its equations,
and proof that decoding never reads the encoder states."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import tiny_model
from seqtrans.attention.memory import MemoryAttention, position_encodings
from seqtrans.data.vocab import BOS, EOS, PAD


@torch.no_grad()
def direct(attn: MemoryAttention, memory: torch.Tensor, lengths: list[int], x: torch.Tensor) -> torch.Tensor:
    """alpha = score(W_alpha s_t) [* L], C_k = sum_t alpha_tk s_t, beta = score(W_beta h),
    c = sum_k beta_k C_k, out = W_o c + b_o, one number at a time."""
    b, _, d = memory.shape
    k_slots = attn.slots
    out = torch.zeros(x.shape[0], x.shape[1], d, dtype=torch.float64)
    wa, wb = attn.w_alpha.weight.double(), attn.w_beta.weight.double()
    for n in range(x.shape[0]):
        sent = n * b // x.shape[0]
        S = lengths[sent]
        raw = [[float(wa[k] @ memory[sent, t].double()) for k in range(k_slots)] for t in range(S)]
        if attn.positions:
            for t in range(S):
                for k in range(k_slots):
                    kk, ss = (k + 1) / k_slots, (t + 1) / S
                    raw[t][k] *= (1 - kk) * (1 - ss) + kk * ss
        if attn.local_width:  # + log N((t + 1/2)/S; (k + 1/2)/K, (width/K)^2), less its constant
            sigma = attn.local_width / k_slots
            for t in range(S):
                for k in range(k_slots):
                    raw[t][k] -= ((t + 0.5) / S - (k + 0.5) / k_slots) ** 2 / (2 * sigma**2)
        alpha = [[0.0] * k_slots for _ in range(S)]
        for k in range(k_slots):
            if attn.encoder_score == "softmax":
                z = sum(math.exp(raw[t][k]) for t in range(S))
                for t in range(S):
                    alpha[t][k] = math.exp(raw[t][k]) / z
            else:
                for t in range(S):
                    alpha[t][k] = 1 / (1 + math.exp(-raw[t][k]))
        contexts = [sum(alpha[t][k] * memory[sent, t].double() for t in range(S)) for k in range(k_slots)]
        for i in range(x.shape[1]):
            if attn.heads > 1:  # per head h: softmax_k((W_q h)_h . (W_k C_k)_h / sqrt(D/H)), values W_v C_k
                assert attn.w_q is not None and attn.w_k is not None and attn.w_v is not None
                q = attn.w_q.weight.double() @ x[n, i].double()
                keys = [attn.w_k.weight.double() @ contexts[k] for k in range(k_slots)]
                values = [attn.w_v.weight.double() @ contexts[k] for k in range(k_slots)]
                dh = d // attn.heads
                mixed = torch.zeros(d, dtype=torch.float64)
                for h in range(attn.heads):
                    part = slice(h * dh, (h + 1) * dh)
                    e = [float(q[part] @ keys[k][part]) / math.sqrt(dh) for k in range(k_slots)]
                    beta = [math.exp(v) / sum(math.exp(u) for u in e) for v in e]
                    mixed[part] = sum(beta[k] * values[k][part] for k in range(k_slots))
                out[n, i] = attn.out.weight.double() @ mixed + attn.out.bias.double()
                continue
            if attn.decoder_score == "content":  # (W_q h) . (W_k C_k) / sqrt(D)
                assert attn.w_q is not None and attn.w_k is not None
                q = attn.w_q.weight.double() @ x[n, i].double()
                keys = [attn.w_k.weight.double() @ contexts[k] for k in range(k_slots)]
                e = [float(q @ keys[k]) / math.sqrt(d) for k in range(k_slots)]
            else:
                e = [float(wb[k] @ x[n, i].double()) for k in range(k_slots)]
            if attn.decoder_score in ("softmax", "content"):
                beta = [math.exp(v) / sum(math.exp(u) for u in e) for v in e]
            else:
                beta = [1 / (1 + math.exp(-v)) for v in e]
            c = sum(beta[k] * contexts[k] for k in range(k_slots))
            out[n, i] = attn.out.weight.double() @ c + attn.out.bias.double()
    return out


@pytest.mark.parametrize("encoder_score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("decoder_score", ["softmax", "sigmoid", "content"])
@pytest.mark.parametrize("positions", [False, True])
def test_memory_attention_computes_the_papers_equations(encoder_score: str, decoder_score: str,
                                                         positions: bool) -> None:
    torch.manual_seed(0)
    attn = MemoryAttention(6, slots=4, encoder_score=encoder_score, decoder_score=decoder_score,
                           positions=positions)
    memory = torch.randn(2, 5, 6)
    lengths = [5, 3]
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    memory[1, 3:] = 1e3  # padding holds garbage; it must not count
    x = torch.randn(4, 3, 6)  # two hypotheses per sentence, three steps
    with torch.no_grad():
        got = attn(x, attn.prepare(memory, mask))
    torch.testing.assert_close(got.double(), direct(attn, memory, lengths, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("positions", "local_width"), [(False, 0.0), (True, 0.0), (False, 1.5)])
def test_multi_head_memory_attention_computes_each_heads_mix(positions: bool, local_width: float) -> None:
    torch.manual_seed(1)
    attn = MemoryAttention(8, slots=3, decoder_score="content", positions=positions, heads=4,
                           local_width=local_width)
    memory = torch.randn(2, 5, 8)
    lengths = [5, 2]
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    memory[1, 2:] = 1e3
    x = torch.randn(6, 2, 8)  # three hypotheses per sentence, two steps
    with torch.no_grad():
        got = attn(x, attn.prepare(memory, mask))
        maps = attn.weights(x[::3], memory, mask)
    torch.testing.assert_close(got.double(), direct(attn, memory, lengths, x), atol=1e-5, rtol=1e-5)
    assert maps.contexts.shape == (2, 2, 3)  # the heads' mean over the contexts, each row sums to 1
    torch.testing.assert_close(maps.contexts.sum(-1), torch.ones(2, 2))


def test_the_local_prior_gives_each_position_slots_of_its_own() -> None:
    # K = S: with a narrow prior and no content scores, slot k is (nearly) position k alone
    attn = MemoryAttention(4, slots=6, local_width=0.3)
    torch.nn.init.zeros_(attn.w_alpha.weight)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    alpha = attn.encoder_weights(torch.randn(2, 6, 4), mask)  # [B, S, M]
    torch.testing.assert_close(alpha[0].argmax(0), torch.arange(6))
    assert alpha[0].diagonal().min() > 0.99
    # three positions over six slots: two slots each, in order, none on the padding
    torch.testing.assert_close(alpha[1].argmax(0), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert alpha[1, 3:].abs().max() == 0


@pytest.mark.parametrize("width", [-1.0, float("nan"), float("inf")])
def test_a_bad_local_width_is_refused(width: float) -> None:
    from seqtrans.config import ModelConfig
    from seqtrans.errors import ConfigError

    with pytest.raises(ConfigError, match="model.memory_local_width"):
        ModelConfig(cross_attention="memory", memory_local_width=width)


def test_memory_heads_need_content_scores() -> None:
    from seqtrans.config import ModelConfig
    from seqtrans.errors import ConfigError

    with pytest.raises(ConfigError, match="model.memory_heads.*memory_decoder_score=content"):
        ModelConfig(cross_attention="memory", memory_heads=4)
    with pytest.raises(ConfigError, match="model.memory_heads.*divide d_model"):
        ModelConfig(d_model=30, heads=2, cross_attention="memory", memory_decoder_score="content",
                    memory_heads=4)


def test_position_encodings_by_hand() -> None:
    # K = 2, S = 4 (one sentence padded to 5): L_ks = (1 - k/2)(1 - s/4) + (k/2)(s/4)
    enc = position_encodings(torch.tensor([[True, True, True, True, False]]), 2)[0]
    expected = [[0.5 * 0.75 + 0.5 * 0.25, 0.25], [0.5 * 0.5 + 0.5 * 0.5, 0.5],
                [0.5 * 0.25 + 0.5 * 0.75, 0.75], [0.5, 1.0], [0.0, 0.0]]
    torch.testing.assert_close(enc, torch.tensor(expected))


def test_the_decoder_keeps_nothing_of_the_source_length() -> None:
    attn = MemoryAttention(8, slots=3)
    state = attn.prepare(torch.randn(2, 50, 8), torch.ones(2, 50, dtype=torch.bool))
    shapes = [getattr(state, f.name).shape for f in dataclasses.fields(state)
              if getattr(state, f.name) is not None]
    assert shapes == [(2, 3, 8)]
    content = MemoryAttention(8, slots=3, decoder_score="content")
    state = content.prepare(torch.randn(2, 50, 8), torch.ones(2, 50, dtype=torch.bool))
    assert [getattr(state, f.name).shape for f in dataclasses.fields(state)] == [(2, 3, 8), (2, 3, 8)]


@pytest.mark.parametrize(("decoder_score", "heads"), [("softmax", 1), ("content", 1), ("content", 2)])
def test_decoding_never_reads_the_encoder_states(decoder_score: str, heads: int) -> None:
    model = tiny_model(cross_attention="memory", memory_slots=3, seed=2, memory_decoder_score=decoder_score,
                       memory_heads=heads)
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 4, EOS, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 10, 4]])
    with torch.no_grad():
        expected = model(src, tgt)
        encoded = model.encode(src)
        state = model.start(encoded, beam=1)
        encoded.memory.fill_(float("nan"))  # poison the encoder output after prepare()
        encoded.mask.fill_(False)
        steps = torch.cat([model.decode(tgt[:, t : t + 1], state=state) for t in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, expected, atol=1e-5, rtol=1e-5)
