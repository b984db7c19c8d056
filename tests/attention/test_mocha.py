"""Monotonic chunkwise attention (MoChA, Chiu and Raffel 2018) against independent
references: the expected attention against the paper's double sum computed term by term
(and its limits, hard monotonic attention's alignment at w = 1 and MILk's attention at w
at least the source), gradients by finite differences, hard decisions against a
brute-force scan over the states read so far (one monotonic head with soft heads,
``mocha``; every head a MoChA head, ``mma_chunk``), streaming against offline greedy
decoding, and a briefly trained model."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import test_policies as policies
import torch
import torch.nn.functional as F
from test_cli import TINY, seqtrans
from test_policies import check_soft_decisions, check_steps_match_teacher_forcing, streamed
from test_streaming import loaded_copy

import seqtrans as api
from conftest import tiny_model
from seqtrans.attention.lookback import LookbackAttention, lookback_weights, preserve_mass
from seqtrans.attention.monotonic import expected_alignment, expected_alignments
from seqtrans.attention.multihead_monotonic import MultiheadMonotonicAttention
from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import generate
from seqtrans.errors import ConfigError
from seqtrans.model.transformer import Transformer
from seqtrans.streaming.decoder import StreamDecoder, stream_greedy

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5], []]
CPU = torch.device("cpu")


def paper_beta(alpha: torch.Tensor, u: torch.Tensor, length: int, w: int) -> list[list[float]]:
    """beta_ij = sum_{k=j}^{j+w-1} alpha_ik exp(u_ij) / sum_{l=k-w+1}^{k} exp(u_il), term by
    term over the real positions.  alpha [T, S], u [T, S] -> [T][S]"""
    t, s = alpha.shape
    out = []
    for i in range(t):
        row = []
        for j in range(s):
            total = 0.0
            for k in range(j, min(j + w, length)):
                window = sum(math.exp(float(u[i, m])) for m in range(max(0, k - w + 1), k + 1))
                total += float(alpha[i, k]) * math.exp(float(u[i, j])) / window
            row.append(total if j < length else 0.0)
        out.append(row)
    return out


def random_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An expected alignment of random energies, soft scores of two heads and a mask with
    padding.  -> alpha [2, 4, 7], u [2, 2, 4, 7], mask [2, 7]"""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    energy = torch.randn(2, 4, 7, generator=gen, dtype=torch.float64) * 2
    alpha = expected_alignments(energy, mask)  # [2, 4, 7]
    return alpha, torch.randn(2, 2, 4, 7, generator=gen, dtype=torch.float64) * 3, mask


@pytest.mark.parametrize("w", [1, 2, 3, 5, 7, 10])
def test_the_chunkwise_expected_attention_is_the_papers_double_sum(w: int) -> None:
    for seed in range(3):
        alpha, u, mask = random_case(seed)
        beta = lookback_weights(alpha, u, mask, chunk=w)
        for r in range(2):
            length = int(mask[r].sum())
            for head in range(2):
                expected = torch.tensor(paper_beta(alpha[r], u[r, head], length, w), dtype=torch.float64)
                assert torch.allclose(beta[r, head], expected, rtol=0, atol=1e-10)


def test_a_chunk_of_one_is_hard_monotonic_attentions_expected_alignment() -> None:
    alpha, u, mask = random_case(4)
    beta = lookback_weights(alpha, u, mask, chunk=1)
    assert torch.allclose(beta, alpha.unsqueeze(1).expand_as(beta), rtol=0, atol=1e-10)


@pytest.mark.parametrize("w", [7, 8, 50])
def test_a_chunk_as_long_as_the_source_is_milks_expected_attention(w: int) -> None:
    alpha, u, mask = random_case(5)
    kept = preserve_mass(alpha.reshape(8, 7), mask.sum(1).repeat_interleave(4)).view(2, 4, 7)
    for a in (alpha, kept):
        milk = lookback_weights(a, u, mask)
        assert torch.allclose(lookback_weights(a, u, mask, chunk=w), milk, rtol=0, atol=1e-10)
    # with the unselected mass at the end symbol, every step's attention is a distribution
    total = lookback_weights(kept, u, mask, chunk=2).sum(-1)
    assert torch.allclose(total, torch.ones(2, 2, 4, dtype=torch.float64))


def test_scores_far_apart_give_finite_weights_and_gradients() -> None:
    """Each window takes its own max: a chunk whose scores are far below the row's largest
    (where a moving sum of exp(u - max of the row) underflows to 0) still has weights."""
    u = torch.tensor([[[[0.0, -2000.0, -2001.0, -2003.0]]]], dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([[[0.1, 0.2, 0.3, 0.4]]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    beta = lookback_weights(alpha, u, mask, chunk=2)
    e1, e2 = math.exp(-1.0), math.exp(-2.0)  # the scores' differences within each window
    expected = [0.1 + 0.2, 0.3 / (1 + e1), 0.3 * e1 / (1 + e1) + 0.4 / (1 + e2), 0.4 * e2 / (1 + e2)]
    assert beta[0, 0, 0].tolist() == pytest.approx(expected, abs=1e-12)
    beta.sum().backward()
    assert u.grad is not None and torch.isfinite(u.grad).all()


def test_gradients_flow_through_the_alignment_and_the_chunk() -> None:
    gen = torch.Generator().manual_seed(0)
    energy = torch.randn(2, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    scores = torch.randn(2, 2, 1, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 5, [True] * 4 + [False]])
    first = F.one_hot(torch.zeros(2, dtype=torch.long), 5).to(torch.float64)

    def beta(e: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        alpha = preserve_mass(expected_alignment(e, first, mask), mask.sum(1))  # [2, 5]
        return lookback_weights(alpha.unsqueeze(1), u, mask, chunk=2)

    assert torch.autograd.gradcheck(beta, (energy, scores))


# ------------------------------------------------------------------ test time


class Arriving:
    """A source that gives one encoder state at a time and counts them."""

    def __init__(self, memory: torch.Tensor) -> None:
        self.memory = memory
        self.given = 0

    def states_from(self, position: int) -> torch.Tensor | None:
        if position >= self.memory.size(1):
            return None
        self.given = position + 1
        return self.memory[:, position : position + 1]


def brute_force(attn: LookbackAttention, memory: torch.Tensor, queries: torch.Tensor,
                w: int) -> tuple[list[torch.Tensor], list[int]]:
    """Each step from scratch: the first position from the last stop with e >= 0 (or none:
    the end), then each head's softmax over the w states ending there among those read.
    memory [1, S, D], queries [1, T, D] -> contexts [D] and positions read, per step"""
    s, heads = memory.size(1), attn.heads
    start, outputs, reads = 0, [], []
    for i in range(queries.size(1)):
        x = queries[:, i : i + 1]
        energy = attn.energy(attn.query(x), attn.key(memory))[0, 0]  # [S]
        stop = next((j for j in range(start, s) if float(energy[j]) >= 0), s)
        start = min(stop, s)
        read = min(stop + 1, s)  # the states read so far
        k, v = attn.soft_kv(memory[:, :read]).chunk(2, dim=-1)  # [1, read, D] each
        q = attn.soft_q(x)[0, 0]  # [D]
        d = q.numel() // heads
        parts = []
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            chunk = slice(max(0, read - w), read)
            weights = torch.softmax(k[0, chunk, cols] @ q[cols] / math.sqrt(d), dim=0)
            parts.append(weights @ v[0, chunk, cols])
        outputs.append(attn.out(torch.cat(parts)))
        reads.append(read)
    return outputs, reads


@pytest.mark.parametrize("seed, w, r", [(1, 1, -1.0), (2, 2, 0.0), (3, 3, 0.0), (4, 2, 2.0), (4, 20, 0.5)])
def test_streaming_hard_decisions_equal_a_brute_force_scan_over_the_states_read(seed: int, w: int,
                                                                                 r: float) -> None:
    torch.manual_seed(seed)
    attn = LookbackAttention(16, 2, chunk=w).eval()
    attn.g.data.fill_(3.0)
    attn.r.data.fill_(r)
    memory, queries = torch.randn(1, 9, 16), torch.randn(1, 7, 16)
    with torch.no_grad():
        expected, reads = brute_force(attn, memory, queries, w)
    source = Arriving(memory)
    state = attn.follow(source, like=memory)
    with torch.no_grad():
        for i in range(queries.size(1)):
            got = attn(queries[:, i : i + 1], state)[0, 0]
            assert source.given == reads[i]  # read exactly as far as the stop point
            assert torch.allclose(got, expected[i], atol=1e-5)
    assert len(set(reads)) > 1  # the cases stop at several positions, the end among them


def brute_force_heads(attn: MultiheadMonotonicAttention, memory: torch.Tensor, queries: torch.Tensor,
                      w: int) -> tuple[list[torch.Tensor], list[int]]:
    """Every head a MoChA head, each step from scratch: head h stops at the first position
    from its last stop with q.k/sqrt(d) + r >= 0 (or the last position), the step reads to
    its slowest head, and head h takes a softmax over the w states ending where it stopped.
    memory [1, S, D], queries [1, T, D] -> contexts [D] and positions read, per step"""
    s, heads = memory.size(1), attn.heads
    k_mono, k_soft, v = attn.k_mono(memory)[0], attn.k_soft(memory)[0], attn.v(memory)[0]  # [S, D] each
    assert attn.q_soft is not None
    d = k_mono.size(1) // heads
    starts, outputs, reads = [0] * heads, [], []
    for i in range(queries.size(1)):
        x = queries[0, i]
        q_mono, q_soft = attn.q_mono(x), attn.q_soft(x)  # [D] each
        parts, found = [], True
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            energy = k_mono[:, cols] @ q_mono[cols] / math.sqrt(d) + attn.r  # [S]
            stop = next((j for j in range(starts[h], s) if float(energy[j]) >= 0), None)
            found = found and stop is not None
            starts[h] = stop = s - 1 if stop is None else stop
            chunk = slice(max(0, stop - w + 1), stop + 1)
            weights = torch.softmax(k_soft[chunk, cols] @ q_soft[cols] / math.sqrt(d), dim=0)
            parts.append(weights @ v[chunk, cols])
        outputs.append(attn.out(torch.cat(parts)))
        reads.append(max(starts) + 1 if found else s)  # a head that finds nothing reads to the end
    return outputs, reads


@pytest.mark.parametrize("seed, w, r", [(0, 1, 0.0), (1, 2, -0.5), (2, 3, 0.5), (3, 20, 0.0)])
def test_every_head_a_mocha_head_equals_a_brute_force_scan_over_the_states_read(seed: int, w: int,
                                                                                 r: float) -> None:
    torch.manual_seed(seed)
    attn = MultiheadMonotonicAttention(16, 2, lookback=True, chunk=w).eval()
    attn.r.data.fill_(r)
    memory, queries = torch.randn(1, 9, 16) * 2, torch.randn(1, 7, 16) * 2
    with torch.no_grad():
        expected, reads = brute_force_heads(attn, memory, queries, w)
    source = Arriving(memory)
    state = attn.follow(source, like=memory)
    with torch.no_grad():
        for i in range(queries.size(1)):
            got = attn(queries[:, i : i + 1], state)[0, 0]
            assert source.given == reads[i]  # read exactly as far as the slowest head
            assert torch.allclose(got, expected[i], atol=1e-5)
    assert len(set(reads)) > 1


def mocha_model(seed: int, r: float, w: int = 2) -> Transformer:
    model = tiny_model(seed=seed, cross_attention="mocha", chunk_size=w, causal_encoder=True,
                       monotonic_noise=0.0)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, LookbackAttention) and attn.chunk == w
        attn.g.data.fill_(3.0)
        attn.r.data.fill_(r)
    return model


@pytest.mark.parametrize("seed, r, w", [(0, 0.0, 1), (1, 0.5, 2), (2, -0.5, 3)])
def test_step_by_step_decoding_equals_teacher_forcing_with_hard_decisions(seed: int, r: float,
                                                                          w: int) -> None:
    check_steps_match_teacher_forcing(mocha_model(seed, r, w), SOURCES[:4])


def test_soft_decisions_decode_step_by_step_as_training_computes() -> None:
    check_soft_decisions(mocha_model(2, -0.5), SOURCES[:4])


@pytest.mark.parametrize("seed, r, w", [(1, 0.5, 2), (2, -0.5, 1), (4, 3.0, 3)])
def test_streaming_writes_what_offline_greedy_decoding_writes(seed: int, r: float, w: int) -> None:
    early = 0
    for source, _, _, delays in streamed(mocha_model(seed, r, w), SOURCES, DecodeConfig(beam=1, max_len_b=3)):
        assert delays == sorted(delays) and all(d <= len(source) for d in delays)
        early += sum(d < len(source) for d in delays)
    assert early > 0  # tokens written before the source had ended


def test_pushed_sources_decode_as_pulled_ones_and_a_session_writes_the_offline_output() -> None:
    model = mocha_model(1, 0.5)
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    rng = random.Random(0)
    for source in SOURCES[:4]:
        pulled = list(stream_greedy(model, source, decode))
        decoder, pushed, rest = StreamDecoder(model, decode), [], list(source)
        while rest:
            n = rng.randint(0, 3)  # empty pushes too
            pushed += decoder.push(rest[:n])
            rest = rest[n:]
        assert pushed + decoder.finish() == pulled
    loaded = loaded_copy(model)
    session = api.stream(loaded)
    for word in "0 1 2 3 4 5 6 5".split():
        session.push(word)
    session.finish()
    offline = generate(model, [[4, 5, 6, 7, 8, 9, 10, 9, EOS]], decode, device=CPU)[0]
    assert session.done and [t - 4 for t in offline[0].tokens] == [int(w) for w in session.output.split()]


def test_a_run_trains_and_evaluates_as_a_stream(tmp_path: Path) -> None:
    out = tmp_path / "mocha"
    done = seqtrans("run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY,
                    "model.cross_attention=mocha", "model.chunk_size=3", "model.causal_encoder=true",
                    "train.latency_weight=0.1", "train.max_steps=4", "train.eval_every=4", "data.test_size=8")
    assert done.returncode == 0, done.stderr
    done = seqtrans("evaluate", str(out), "--stream", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert {"exact_match", "stream_al", "stream_dal"} <= set(metrics)


def test_beam_search_follows_its_hypotheses() -> None:
    model = mocha_model(1, 0.5)
    config = DecodeConfig(beam=3, max_len_b=4, nbest=3)
    batched = generate(model, [s + [EOS] for s in SOURCES], config, device=CPU)
    alone = [generate(model, [s + [EOS]], config, device=CPU)[0] for s in SOURCES]
    assert [[h.tokens for h in hs] for hs in batched] == [[h.tokens for h in hs] for hs in alone]


def test_the_latency_weight_reaches_the_policy() -> None:
    policies.test_the_latency_weight_adds_the_expected_lagging_and_its_gradient_reaches_the_policy("mocha")


def test_the_chunk_width_is_at_least_one() -> None:
    with pytest.raises(ConfigError, match="model.chunk_size"):
        ModelConfig(cross_attention="mocha", chunk_size=0)
    with pytest.raises(ValueError, match="at least one position"):
        LookbackAttention(16, 2, chunk=0)


def test_a_briefly_trained_model_decodes_outputs_that_follow_the_input_and_end() -> None:
    """A copy task, 200 updates of 16 sentences: greedy outputs differ between inputs, begin
    with the input's first token, end before the length bound, and stream as they decode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model trains faster on one thread
    try:
        model = train_copy(steps=200)
    finally:
        torch.set_num_threads(threads)
    tests = [[4, 5, 6], [10, 9, 8, 7], [7, 7, 5], [6, 4], [9, 8, 4, 10, 5]]
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5)
    outputs = [h[0].tokens for h in generate(model, [s + [EOS] for s in tests], config, device=CPU)]
    assert len({tuple(o) for o in outputs}) == len(tests)
    assert [o[:1] for o in outputs] == [s[:1] for s in tests]
    assert all(len(o) < len(s) + 1 + 5 for o, s in zip(outputs, tests))  # the end symbol came first
    for _ in streamed(model, tests, config):
        pass


def train_copy(*, steps: int) -> Transformer:
    """A MoChA model (w = 2) trained to copy sequences of 2 to 5 tokens, in eval mode."""
    model = tiny_model(seed=0, cross_attention="mocha", chunk_size=2, causal_encoder=True,
                       monotonic_r_init=-1.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        sources = [torch.randint(4, 11, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 6, (16,), generator=gen)]
        src = pad_batch([s + [EOS] for s in sources])
        tgt = pad_batch([[BOS, *s, EOS] for s in sources])
        loss = F.cross_entropy(model(src, tgt[:, :-1]).transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for layer in model.decoder_layers:
        layer.cross_attn.take_delays()  # type: ignore[union-attr]  # the last pass's, unused here
    return model.eval()
