"""Simultaneous policies beyond hard monotonic attention: wait-k (fixed, multi-k and at
test time) and monotonic infinite lookback (MILk), each against an independent
reference: a brute-force mask or sum, a sequential loop, offline decoding."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch

import seqtrans
from conftest import tiny_model
from seqtrans.attention import waiting
from seqtrans.attention.lookback import LookbackAttention, lookback_weights, preserve_mass
from seqtrans.attention.monotonic import expected_alignment
from seqtrans.attention.scaled_dot import CrossAttention
from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import generate
from seqtrans.errors import ConfigError, UsageError
from seqtrans.model.transformer import Transformer
from seqtrans.streaming.decoder import check_streamable, stream_greedy
from seqtrans.training import step
from seqtrans.training.loss import expected_lagging
from seqtrans.training.step import LossModule, batch_hidden, training_lag

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5], []]
CPU = torch.device("cpu")


class Counting:
    """A source that records how many tokens were taken from it."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.taken = 0

    def __iter__(self) -> Iterator[int]:
        for token in self.tokens:
            self.taken += 1
            yield token


def check_steps_match_teacher_forcing(model: Transformer, sources: list[list[int]]) -> None:
    """Decoding a random target one token at a time gives the scores of decoding it at once."""
    src = pad_batch([s + [EOS] for s in sources])
    tgt = torch.randint(4, 11, (len(sources), 6))
    tgt[:, 0] = BOS
    whole = model(src, tgt)
    state = model.start(model.encode(src), beam=1)
    steps = torch.cat([model.decode(tgt[:, i : i + 1], state=state) for i in range(tgt.size(1))], dim=1)
    assert torch.allclose(whole, steps, atol=1e-5)


def offline(model: Transformer, sources: list[list[int]], config: DecodeConfig) -> list[list[int]]:
    hyps = generate(model, [s + [EOS] for s in sources], config, device=CPU)
    return [h[0].tokens if h else [] for h in hyps]


def streamed(model: Transformer, sources: list[list[int]],
             config: DecodeConfig) -> Iterator[tuple[list[int], list[int], Counting, list[int]]]:
    """Each source decoded as a stream (:func:`stream_greedy`), checked to write what offline
    greedy decoding writes: the source, that output, the counted source and each token's delay."""
    for source, expected in zip(sources, offline(model, sources, config)):
        counting = Counting(source)
        emitted = list(stream_greedy(model, counting, config))
        assert [e.token for e in emitted] == expected
        yield source, expected, counting, [e.delay for e in emitted]


# ------------------------------------------------------------------ wait-k


def test_the_wait_k_mask_shows_target_position_i_the_first_i_plus_k_source_positions() -> None:
    torch.manual_seed(0)
    attn = CrossAttention(16, 4, lag=2).eval()
    memory = torch.randn(2, 6, 16)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    x = torch.randn(2, 5, 16)
    got = attn(x, attn.prepare(memory, mask))
    k, v = attn.kv(memory).chunk(2, dim=-1)
    q = attn.q(x)
    for b in range(2):
        length = int(mask[b].sum())
        for i in range(5):
            seen = min(i + 2, length)
            heads = []
            for h in range(4):
                cols = slice(4 * h, 4 * h + 4)
                weights = torch.softmax(q[b, i, cols] @ k[b, :seen, cols].T / 2.0, dim=-1)
                heads.append(weights @ v[b, :seen, cols])
            assert torch.allclose(got[b, i], attn.out(torch.cat(heads)), atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_wait_k_step_by_step_decoding_equals_teacher_forcing(k: int) -> None:
    check_steps_match_teacher_forcing(tiny_model(seed=3, wait_k=k, causal_encoder=True), SOURCES[:4])


@pytest.mark.parametrize("seed, trained_k, k", [(0, 3, 0), (1, 3, 1), (2, 0, 2), (3, 2, 5), (4, 1, 30)])
def test_streaming_wait_k_writes_what_offline_wait_k_decoding_writes(seed: int, trained_k: int,
                                                                      k: int) -> None:
    model = tiny_model(seed=seed, wait_k=trained_k, causal_encoder=True)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, wait_k=k)
    lag = k or trained_k
    for source, _, _, delays in streamed(model, SOURCES, config):
        # step i has read min(i + k, |x|) tokens (the bound a|x| + b may make it read more)
        for i, delay in enumerate(delays):
            assert delay >= min(i + lag, len(source)) if lag else delay == len(source)
        if delays and lag:
            assert delays[0] == min(lag, len(source))


def test_wait_k_reads_k_tokens_before_the_first_write() -> None:
    model = tiny_model(seed=5, wait_k=3, causal_encoder=True)
    source = Counting(SOURCES[2])
    stream = stream_greedy(model, source, DecodeConfig(beam=1, max_len_b=20))
    first = next(stream, None)
    if first is not None:  # this seed writes something
        assert first.delay == 3 and source.taken == 3


def test_a_decoding_lag_overrides_the_models_and_beam_search_takes_it() -> None:
    model = tiny_model(seed=6, wait_k=1, causal_encoder=True)
    for beam in (1, 3):
        config = DecodeConfig(beam=beam, max_len_b=4)
        full = offline(model, SOURCES, dataclasses.replace(config, wait_k=1000))
        plain = tiny_model(seed=6, causal_encoder=True)  # the same weights without a lag
        assert full == offline(plain, SOURCES, config)
        with waiting(1000):
            assert offline(model, SOURCES, config) == full


def test_multi_k_draws_a_lag_per_batch_from_one_to_the_longest_source() -> None:
    model = tiny_model(seed=0, multi_k=True, causal_encoder=True).train()
    mask = torch.ones(2, 7, dtype=torch.bool)
    torch.manual_seed(11)
    lags = [training_lag(model, mask) for _ in range(200)]
    assert set(lags) == set(range(1, 8))
    torch.manual_seed(11)
    assert [training_lag(model, mask) for _ in range(200)] == lags  # a seed repeats them
    assert training_lag(model.eval(), mask) is None


def test_multi_k_training_masks_each_batch_at_its_drawn_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(seed=0, multi_k=True, causal_encoder=True).train()
    src = pad_batch([s + [EOS] for s in SOURCES[:4]])
    tgt = torch.randint(4, 11, (4, 5))
    monkeypatch.setattr(step, "training_lag", lambda model, mask: 2)
    drawn = batch_hidden(model, src, tgt)
    fixed = tiny_model(seed=0, wait_k=2, causal_encoder=True).train()
    assert torch.allclose(drawn, fixed.hidden(src, tgt), atol=1e-6)
    assert not torch.allclose(drawn, model.hidden(src, tgt), atol=1e-6)  # the model alone reads it all


@pytest.mark.parametrize("key, value, message", [
    ("model.wait_k", "-1", "model.wait_k"), ("decode.wait_k", "-2", "decode.wait_k"),
    ("decode.wait_k", "1.5", "decode.wait_k"), ("model.wait_k", "two", "model.wait_k")])
def test_a_lag_that_is_not_a_count_is_a_config_error_naming_its_key(key: str, value: str,
                                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        seqtrans.resolve_config("copy", overrides=[f"{key}={value}"])


def test_wait_k_needs_scaled_dot_encoder_decoder_attention() -> None:
    with pytest.raises(ConfigError, match="model.multi_k.*cross_attention=memory"):
        ModelConfig(multi_k=True, cross_attention="memory")


def test_streaming_names_the_options_a_model_lacks() -> None:
    with pytest.raises(UsageError, match="cross_attention=monotonic, milk, mocha, mma_hard, mma_il, "
                                         "mma_chunk or scaled_dot .*memory"):
        check_streamable(tiny_model(cross_attention="memory", causal_encoder=True))
    with pytest.raises(UsageError, match="milk .*causal_encoder=true.*scaled_dot.*decode.wait_k"):
        check_streamable(tiny_model(cross_attention="milk"))
    check_streamable(tiny_model(wait_k=2))  # an encoder that reads everything: re-encoded at each read


# ------------------------------------------------------------------ MILk


def test_lookback_weights_equal_the_sum_over_where_the_monotonic_head_stops() -> None:
    torch.manual_seed(0)
    n, h, t, s = 2, 3, 4, 6
    alpha = torch.rand(n, t, s, dtype=torch.float64)
    mask = torch.ones(n, s, dtype=torch.bool)
    mask[1, 4:] = False
    alpha = alpha / alpha.sum(-1, keepdim=True) * 0.9 * mask.unsqueeze(1)
    u = torch.randn(n, h, t, s, dtype=torch.float64)
    beta = lookback_weights(alpha, u, mask)
    for r in range(n):
        length = int(mask[r].sum())
        for head in range(h):
            for i in range(t):
                for j in range(s):
                    expected = 0.0 if j >= length else sum(
                        float(alpha[r, i, k] * torch.exp(u[r, head, i, j])
                              / torch.exp(u[r, head, i, : k + 1]).sum())
                        for k in range(j, length))
                    assert float(beta[r, head, i, j]) == pytest.approx(expected, abs=1e-12)
    # with the unselected mass preserved, each row of each head is a distribution
    kept = preserve_mass(alpha[:, 0], mask.sum(1))
    assert torch.allclose(lookback_weights(kept.unsqueeze(1), u[:, :, :1], mask).sum(-1),
                          torch.ones(n, h, 1, dtype=torch.float64))


def test_lookback_weights_have_finite_gradients_when_alignments_are_nearly_hard() -> None:
    energy = torch.tensor([[30.0, -30.0, 30.0, 30.0, -30.0]], dtype=torch.float64, requires_grad=True)
    scores = torch.randn(1, 2, 1, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, True, False]])
    first = torch.zeros(1, 5, dtype=torch.float64)
    first[0, 0] = 1.0
    alpha = preserve_mass(expected_alignment(energy, first, mask), mask.sum(1))
    lookback_weights(alpha.unsqueeze(1), scores, mask).sum().backward()
    assert energy.grad is not None and torch.isfinite(energy.grad).all()
    assert scores.grad is not None and torch.isfinite(scores.grad).all()
    # away from the floor that keeps log(0) finite, the gradients are exact
    soft = torch.rand(1, 1, 5, dtype=torch.float64) + 0.1
    soft = (soft / soft.sum(-1, keepdim=True)).requires_grad_()
    full = torch.ones(1, 5, dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda a, u: lookback_weights(a, u, full),
                                    (soft, scores.detach().requires_grad_()))


def milk_model(seed: int, r: float) -> Transformer:
    model = tiny_model(seed=seed, cross_attention="milk", causal_encoder=True, monotonic_noise=0.0)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, LookbackAttention)
        attn.g.data.fill_(3.0)
        attn.r.data.fill_(r)
    return model


@pytest.mark.parametrize("seed, r", [(0, 0.0), (1, 0.5), (2, -0.5), (3, 3.0)])
def test_milk_step_by_step_decoding_equals_teacher_forcing_with_hard_decisions(seed: int, r: float) -> None:
    check_steps_match_teacher_forcing(milk_model(seed, r), SOURCES[:4])


@pytest.mark.parametrize("seed, r", [(0, 0.0), (2, -0.5)])
def test_milk_soft_decisions_decode_step_by_step_as_training_computes(seed: int, r: float) -> None:
    """The analysis mode: in eval, steps under the expected alignment equal the training
    forward pass over the whole target (noise and dropout off), and differ from hard decisions."""
    check_soft_decisions(milk_model(seed, r), SOURCES[:4])


def check_soft_decisions(model: Transformer, sources: list[list[int]]) -> None:
    """Steps decoded in eval with ``soft_decisions`` equal the training pass of the
    encoder-decoder attention (a model without noise or dropout), and differ from hard
    decisions."""
    src = pad_batch([s + [EOS] for s in sources])
    tgt = torch.randint(4, 11, (len(sources), 6))
    tgt[:, 0] = BOS
    model.eval()
    hard = model(src, tgt)
    cross = [layer.cross_attn for layer in model.decoder_layers]
    for attn in cross:
        attn.soft_decisions = True  # type: ignore[union-attr]
    state = model.start(model.encode(src), beam=1)
    steps = torch.cat([model.decode(tgt[:, i : i + 1], state=state) for i in range(tgt.size(1))], dim=1)
    for attn in cross:
        attn.train()  # the expected alignment
    assert torch.allclose(model(src, tgt), steps, atol=1e-5)
    assert not torch.allclose(hard, steps, atol=1e-3)


# (seeds 0 and 3 happen to read each source to its end before writing: the same output all the same)
@pytest.mark.parametrize("seed, r, writes_early", [(0, 0.0, False), (1, 0.5, True), (2, -0.5, True),
                                                   (3, 3.0, False), (4, 3.0, True)])
def test_streaming_milk_writes_what_offline_greedy_decoding_writes(seed: int, r: float,
                                                                   writes_early: bool) -> None:
    model = milk_model(seed, r)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    early = 0
    for source, _, _, delays in streamed(model, SOURCES, config):
        assert delays == sorted(delays) and all(d <= len(source) for d in delays)
        early += sum(d < len(source) for d in delays)
    assert (early > 0) == writes_early  # tokens written before the source had ended


def test_milk_beam_search_follows_its_hypotheses() -> None:
    model = milk_model(1, 0.5)
    config = DecodeConfig(beam=3, max_len_b=4, nbest=3)
    batched = generate(model, [s + [EOS] for s in SOURCES], config, device=CPU)
    alone = [generate(model, [s + [EOS]], config, device=CPU)[0] for s in SOURCES]
    assert [[h.tokens for h in hs] for hs in batched] == [[h.tokens for h in hs] for hs in alone]


def dal(delays: list[float], source_length: int) -> float:
    """Differentiable average lagging, one sentence, by its definition."""
    step = source_length / len(delays)
    lagged: list[float] = []
    for i, d in enumerate(delays):
        lagged.append(d if i == 0 else max(d, lagged[-1] + step))
    return sum(g - i * step for i, g in enumerate(lagged)) / len(delays)


def test_the_latency_loss_is_differentiable_average_lagging_per_sentence() -> None:
    torch.manual_seed(0)
    delays = torch.rand(3, 5, dtype=torch.float64) * 6
    target = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])
    sources = torch.tensor([6, 3, 9])
    got = expected_lagging(delays, target, sources)
    for b in range(3):
        length = int(target[b].sum())
        assert float(got[b]) == pytest.approx(dal(delays[b, :length].tolist(), int(sources[b])), abs=1e-12)


@pytest.mark.parametrize("attention", ["milk", "monotonic"])
def test_the_latency_weight_adds_the_expected_lagging_and_its_gradient_reaches_the_policy(
        attention: str) -> None:
    model = tiny_model(seed=0, cross_attention=attention, causal_encoder=True, monotonic_noise=0.0).train()
    src = pad_batch([s + [EOS] for s in SOURCES[:4]])
    tgt = pad_batch([[BOS, 4, 5, 6, 7], [BOS, 4], [BOS, 6, 7, 8], [BOS, 9, 9]])
    out = torch.where(tgt.roll(-1, 1) == PAD, torch.full_like(tgt, PAD), tgt.roll(-1, 1))
    out[:, -1] = PAD
    torch.manual_seed(1)
    plain, _ = LossModule(model, 0.1, "fp32")(src, tgt, out)
    torch.manual_seed(1)
    weighted, _ = LossModule(model, 0.1, "fp32", latency_weight=0.5)(src, tgt, out)
    assert weighted.item() > plain.item()
    model.zero_grad()
    (weighted - plain).backward()
    r = [layer.cross_attn.r for layer in model.decoder_layers]  # type: ignore[union-attr]
    assert all(p.grad is not None and math.isfinite(float(p.grad)) and float(p.grad) != 0.0 for p in r)
