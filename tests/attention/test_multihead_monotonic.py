"""Monotonic multihead attention (Ma et al. 2020), hard (MMA-H) and infinite lookback
(MMA-IL), against independent references: the expected alignment against a sequential
loop over the paper's recurrence, hard decisions against a brute-force scan, streaming
against offline greedy decoding, the step's delay against the slowest head, the latency
losses against hand-computed values, and the undo rule of the decoding state."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_policies import check_soft_decisions, check_steps_match_teacher_forcing, streamed

from conftest import tiny_model
from seqtrans.attention.multihead_monotonic import (
    MultiheadMonotonicAttention,
    MultiheadMonotonicState,
    hard_positions,
    head_alignments,
)
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import generate
from seqtrans.model.transformer import Transformer, attention_maps
from seqtrans.streaming.decoder import check_streamable
from seqtrans.training.loss import latency_losses
from seqtrans.training.step import LossModule

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5]]
CONFIG = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
CPU = torch.device("cpu")
MECHANISMS = ("mma_hard", "mma_il", "mma_chunk")  # mma_chunk: MMA-IL over chunks (test_mocha.py)


def sequential_alignment(energy: torch.Tensor, length: int) -> list[list[float]]:
    """One head, eq. (11)-(14) of Raffel et al. position by position, with mass preservation:
    q_ij = (1 - p_i,j-1) q_i,j-1 + alpha_i-1,j, alpha_ij = p_ij q_ij; what is left
    unselected goes to the last real position.  energy [T, S] -> alpha [T][S]"""
    t, s = energy.shape
    previous = [1.0] + [0.0] * (s - 1)
    out = []
    for i in range(t):
        q, p_before, alpha = 0.0, 0.0, []
        for j in range(s):
            p = 1 / (1 + math.exp(-float(energy[i, j]))) if j < length else 0.0
            q = (1 - p_before) * q + previous[j]
            alpha.append(p * q)
            p_before = p
        alpha[length - 1] += max(0.0, 1 - sum(alpha))
        out.append(alpha)
        previous = alpha
    return out


def test_each_heads_expected_alignment_is_the_papers_recurrence_with_mass_preservation() -> None:
    gen = torch.Generator().manual_seed(0)
    energy = torch.randn(2, 3, 5, 7, generator=gen, dtype=torch.float64) * 2  # [N, H, T, S]
    lengths = torch.tensor([7, 4])
    mask = torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)
    got = head_alignments(energy, mask, lengths)
    for n in range(2):
        for h in range(3):
            expected = torch.tensor(sequential_alignment(energy[n, h], int(lengths[n])), dtype=torch.float64)
            assert torch.allclose(got[n, h], expected, atol=1e-10)
    assert torch.allclose(got.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))  # mass preserved
    assert (got[1, :, :, 4:] == 0).all()  # padding never attended


def brute_force_positions(energy: torch.Tensor, length: int) -> list[int]:
    """One head's hard decisions by scanning: from the last stop, the first e >= 0, else the end."""
    t, _ = energy.shape
    position, out = 0, []
    for i in range(t):
        j = position
        while j < length and float(energy[i, j]) < 0:
            j += 1
        position = j if j < length else length - 1
        out.append(position)
    return out


def test_hard_decisions_are_a_scan_from_the_last_stop_for_every_head() -> None:
    gen = torch.Generator().manual_seed(1)
    energy = torch.randn(3, 4, 6, 8, generator=gen) - 0.8
    lengths = torch.tensor([8, 5, 1])
    got = hard_positions(energy, lengths)
    for n in range(3):
        for h in range(4):
            assert got[n, h].tolist() == brute_force_positions(energy[n, h], int(lengths[n]))


def test_the_expectation_is_the_hard_process_when_probabilities_are_0_or_1() -> None:
    gen = torch.Generator().manual_seed(2)
    energy = torch.where(torch.rand(2, 3, 5, 6, generator=gen) < 0.3, 60.0, -60.0).double()
    lengths = torch.tensor([6, 4])
    mask = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    alpha = head_alignments(energy, mask, lengths)
    hard = torch.nn.functional.one_hot(hard_positions(energy, lengths), 6).double()
    assert torch.allclose(alpha, hard, atol=1e-12)


def mma_model(name: str, seed: int, r: float) -> Transformer:
    model = tiny_model(seed=seed, cross_attention=name, causal_encoder=True, monotonic_noise=0.0)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, MultiheadMonotonicAttention) and attn.lookback == (name != "mma_hard")
        assert attn.chunk == (2 if name == "mma_chunk" else None)
        attn.r.data.fill_(r)
    return model


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("seed, r", [(0, 0.0), (1, 1.0), (2, -1.0)])
def test_step_by_step_decoding_equals_teacher_forcing_with_hard_decisions(name: str, seed: int,
                                                                          r: float) -> None:
    check_steps_match_teacher_forcing(mma_model(name, seed, r), SOURCES)


@pytest.mark.parametrize("name", MECHANISMS)
def test_soft_decisions_decode_step_by_step_as_training_computes(name: str) -> None:
    check_soft_decisions(mma_model(name, 1, 0.5), SOURCES)  # noise 0 (mma_model), no dropout


def slowest_heads(model: Transformer, source: list[int], output: list[int]) -> list[int]:
    """Source tokens each output token needs, from teacher-forced hard decisions: one more
    than the furthest position any head of any layer stops at, at most |x| (the end
    symbol is not a token)."""
    src = torch.tensor([source + [EOS]])
    tgt = torch.tensor([[BOS, *output]])
    maps = attention_maps(model, src, tgt)
    furthest = torch.stack([w.positions[0] for w in maps.cross]).amax(dim=(0, 1))  # type: ignore[union-attr]
    return [min(int(p) + 1, len(source)) for p in furthest[: len(output)]]


# (seed 0 with r = -1 reads each source to its end before writing: the same output all the same)
@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("seed, r, writes_early", [(0, -1.0, False), (1, 1.0, True), (2, 0.5, True)])
def test_streaming_writes_what_offline_greedy_decoding_writes_once_every_head_stopped(
        name: str, seed: int, r: float, writes_early: bool) -> None:
    model = mma_model(name, seed, r)
    check_streamable(model)
    early = 0
    for source, expected, counting, delays in streamed(model, SOURCES, CONFIG):
        # a step writes when its slowest head has stopped (the output bound a|x| + b aside)
        needed = slowest_heads(model, source, expected)
        bound = [max(d, i + 1 - CONFIG.max_len_b) for i, d in enumerate(needed)]
        assert delays == [min(max(bound[: i + 1]), len(source)) for i in range(len(delays))]
        assert counting.taken == (delays[-1] if delays else counting.taken)
        early += sum(d < len(source) for d in delays)
    assert (early > 0) == writes_early


@pytest.mark.parametrize("name", MECHANISMS)
def test_beam_search_follows_its_hypotheses(name: str) -> None:
    model = mma_model(name, 1, 0.5)
    config = DecodeConfig(beam=3, max_len_b=4, nbest=3)
    batched = generate(model, [s + [EOS] for s in SOURCES], config, device=CPU)
    alone = [generate(model, [s + [EOS]], config, device=CPU)[0] for s in SOURCES]
    assert [[h.tokens for h in hs] for hs in batched] == [[h.tokens for h in hs] for hs in alone]


class Failing:
    """An arriving source whose ``states_from`` raises once, the first time it is asked
    for a position beyond ``until``, then serves encoder states of ``memory`` [1, S, D]."""

    def __init__(self, memory: torch.Tensor, until: int) -> None:
        self.memory = memory
        self.until = until
        self.failed = False

    def states_from(self, position: int) -> torch.Tensor | None:
        if position >= self.memory.size(1):
            return None
        if position >= self.until and not self.failed:
            self.failed = True
            raise TimeoutError("no more source yet")
        return self.memory[:, position : position + 1]


@pytest.mark.parametrize("lookback, chunk", [(False, None), (True, None), (True, 2)])
def test_a_step_that_runs_out_of_source_is_undone_by_restoring_the_states_fields(lookback: bool,
                                                                                 chunk: int | None) -> None:
    torch.manual_seed(0)
    attn = MultiheadMonotonicAttention(16, 4, lookback=lookback, chunk=chunk, r_init=-0.3).eval()
    memory = torch.randn(1, 7, 16)
    queries = torch.randn(1, 5, 16)

    def run(source: Failing) -> list[torch.Tensor]:
        state = attn.follow(source, like=memory)
        outputs = []
        for i in range(queries.size(1)):
            saved = {f.name: getattr(state, f.name) for f in dataclasses.fields(MultiheadMonotonicState)}
            held = {name: value.clone() for name, value in saved.items() if isinstance(value, torch.Tensor)}
            try:
                outputs.append(attn(queries[:, i : i + 1], state))
            except TimeoutError:
                # nothing written in place: the tensors the fields held are unchanged
                assert all(torch.equal(held[name], saved[name]) for name in held)
                for name, value in saved.items():
                    setattr(state, name, value)
                outputs.append(attn(queries[:, i : i + 1], state))
        return outputs

    plain = run(Failing(memory, until=10**9))
    interrupted = Failing(memory, until=2)
    undone = run(interrupted)
    assert interrupted.failed
    assert all(torch.equal(a, b) for a, b in zip(plain, undone))


def test_the_latency_losses_against_hand_computed_values() -> None:
    # one sentence, |x| = 4, |y| = 2; layer 1 has two heads, layer 2 one
    layer1 = torch.tensor([[[1.0, 2.0], [3.0, 3.0]]])  # [B, H, T]
    layer2 = torch.tensor([[2.0, 4.0]])  # [B, T]: one head
    mask = torch.tensor([[True, True]])
    average, variance = latency_losses([layer1, layer2], mask, torch.tensor([4]))
    # layer 1's steps, heads weighted by softmax: (1 e + 3 e^3) / (e + e^3), (2 e^2 + 3 e^3) / (e^2 + e^3)
    e = math.e
    d1, d2 = (e + 3 * e**3) / (e + e**3), (2 * e**2 + 3 * e**3) / (e**2 + e**3)
    # DAL with 1/gamma = 2: g' = (d1, max(d2, d1 + 2)) -> (d1 + (d1 + 2 - 2)) / 2 = d1
    assert d2 < d1 + 2
    # layer 2, one head (2, 4): g' = (2, 4) -> (2 + (4 - 2)) / 2 = 2; mean over the layers
    assert average.tolist() == pytest.approx([(d1 + 2) / 2])
    # step 1: delays 1, 3, 2 -> variance 2/3; step 2: 2, 3, 4 -> 2/3
    assert variance.tolist() == pytest.approx([2 / 3])
    # padding: a second sentence whose second step is padding counts its first step only
    two = torch.tensor([[[1.0, 2.0], [3.0, 3.0]], [[0.0, 9.0], [2.0, 9.0]]])
    _, var = latency_losses([two], torch.tensor([[True, True], [True, False]]), torch.tensor([4, 4]))
    assert var.tolist() == pytest.approx([(1.0 + 0.25) / 2, 1.0])


@pytest.mark.parametrize("name", MECHANISMS)
def test_both_latency_weights_add_their_loss_and_reach_the_energy_bias(name: str) -> None:
    model = tiny_model(seed=0, cross_attention=name, causal_encoder=True, monotonic_noise=0.0).train()
    src = pad_batch([s + [EOS] for s in SOURCES])
    tgt = pad_batch([[BOS, 4, 5, 6, 7], [BOS, 4], [BOS, 6, 7, 8], [BOS, 9, 9]])
    out = torch.where(tgt.roll(-1, 1) == PAD, torch.full_like(tgt, PAD), tgt.roll(-1, 1))
    out[:, -1] = PAD
    plain, _ = LossModule(model, 0.1, "fp32")(src, tgt, out)
    for weights in ({"latency_weight": 0.5}, {"latency_weight_var": 0.5}):
        weighted, _ = LossModule(model, 0.1, "fp32", **weights)(src, tgt, out)
        assert weighted.item() > plain.item()
        model.zero_grad()
        (weighted - plain).backward()
        r = [layer.cross_attn.r for layer in model.decoder_layers]  # type: ignore[union-attr]
        assert all(p.grad is not None and math.isfinite(float(p.grad)) and float(p.grad) != 0.0 for p in r)
        plain, _ = LossModule(model, 0.1, "fp32")(src, tgt, out)  # a fresh graph for the next weight
