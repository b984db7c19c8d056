"""Monotonic attention (Raffel et al. 2017): the parallel expected alignment against the
sequential recurrence, hard attention against the expectation, the energy function,
and the linear, online scan."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from seqtrans.attention import monotonic
from seqtrans.attention.monotonic import (
    MonotonicAttention,
    expected_alignment,
    expected_alignments,
    expected_delays,
)
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import BOS, EOS, PAD


def recurrence(energy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. (11)-(14), one position at a time: q_ij = (1 - p_i,j-1) q_i,j-1 + alpha_i-1,j,
    alpha_ij = p_ij q_ij, with q_i,0 = p_i,0 = 0 and alpha_0 = delta_1; padding never selected."""
    r, t, s = energy.shape
    out = torch.zeros(r, t, s, dtype=torch.float64)
    for row in range(r):
        previous = [1.0] + [0.0] * (s - 1)
        for i in range(t):
            q, p_before = 0.0, 0.0
            alpha = []
            for j in range(s):
                p = 1 / (1 + math.exp(-float(energy[row, i, j]))) if mask[row, j] else 0.0
                q = (1 - p_before) * q + previous[j]
                alpha.append(p * q)
                p_before = p
            out[row, i] = torch.tensor(alpha, dtype=torch.float64)
            previous = alpha
    return out


def paper_parallel_form(energy: torch.Tensor) -> torch.Tensor:
    """Appendix C.1 as the paper computes it: cumprod in log space, the division clamped
    to [1e-10, 1]."""
    r, t, s = energy.shape
    previous = torch.zeros(r, s, dtype=energy.dtype)
    previous[:, 0] = 1
    steps = []
    for i in range(t):
        p = torch.sigmoid(energy[:, i])
        logs = torch.log((1 - p).clamp(min=1e-38))
        cumprod = torch.exp(torch.cumsum(logs, -1) - logs)  # exclusive
        previous = p * cumprod * torch.cumsum(previous / cumprod.clamp(1e-10, 1), -1)
        steps.append(previous)
    return torch.stack(steps, 1)


def test_the_parallel_expectation_equals_the_sequential_recurrence() -> None:
    gen = torch.Generator().manual_seed(0)
    energy = torch.randn(3, 6, 9, generator=gen, dtype=torch.float64) * 2
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 5:] = False  # a shorter source
    expected = recurrence(energy, mask)
    torch.testing.assert_close(expected_alignments(energy, mask), expected, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(expected_alignments(energy.float(), mask).double(), expected,
                               atol=1e-6, rtol=1e-4)
    assert (expected_alignments(energy, mask).sum(-1) <= 1 + 1e-12).all()  # the rest attends nothing
    # starting from another step's alignment (incremental decoding) continues the recurrence
    later = expected_alignments(energy[:, 3:], mask, initial=expected[:, 2].clone())
    torch.testing.assert_close(later, expected[:, 3:], atol=1e-12, rtol=1e-9)


def enumerated_delays(energy: torch.Tensor, length: int) -> list[float]:
    """The expected delay of each step of one sentence by enumerating every path of the hard
    process: from the last position attended, each position is selected with probability
    p_ij, a step that selects none attends nothing from then on, and a step that attends
    position j has read min(j + 1, length - 1) source words (the end symbol not counted);
    attending nothing has read them all."""
    t = energy.size(0)
    p = torch.sigmoid(energy.double())
    words = length - 1
    delays = [0.0] * t
    # (probability, position attended at the previous step or None once nothing is attended)
    paths: list[tuple[float, int | None]] = [(1.0, 0)]
    for i in range(t):
        following: list[tuple[float, int | None]] = []
        for chance, start in paths:
            if start is None:
                delays[i] += chance * words
                following.append((chance, None))
                continue
            unselected = chance
            for j in range(start, length):
                picked = unselected * float(p[i, j])
                delays[i] += picked * min(j + 1, words)
                following.append((picked, j))
                unselected *= 1 - float(p[i, j])
            delays[i] += unselected * words
            following.append((unselected, None))
        paths = following
    return delays


def test_the_expected_delays_are_those_of_the_hard_process_enumerated() -> None:
    gen = torch.Generator().manual_seed(3)
    energy = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64) * 2
    lengths = torch.tensor([5, 3])
    mask = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)
    got = expected_delays(expected_alignments(energy, mask), lengths)
    for row in range(2):
        want = enumerated_delays(energy[row, :, : int(lengths[row])], int(lengths[row]))
        assert got[row].tolist() == pytest.approx(want, abs=1e-9)


def test_the_expectation_stays_exact_where_probabilities_saturate() -> None:
    # trained energies are large: cumprod(1 - p) falls below any fixed epsilon within a few
    # positions, where the paper's clamped division loses the mass carried over from the
    # previous step, and log space does not
    gen = torch.Generator().manual_seed(1)
    energy = torch.randn(2, 3, 30, generator=gen, dtype=torch.float64)
    energy[:, 0, :10], energy[:, 0, 10] = -25.0, 25.0  # step 1 attends position 10
    energy[:, 1, :10] = 12.0  # step 2: 1 - p = 6e-6 before it, cumprod(1 - p) = 1e-52 there
    mask = torch.ones(2, 30, dtype=torch.bool)
    expected = recurrence(energy, mask)
    assert expected[:, 1, 10:].sum() > 0.5  # the mass that goes on from position 10
    ours = expected_alignments(energy.float(), mask).double()
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-4)
    assert (paper_parallel_form(energy.float()).double() - expected).abs().max() > 0.1


def test_gradients_are_finite_at_saturated_probabilities() -> None:
    energy = torch.tensor([[[40.0, -40.0, 40.0, -40.0], [-40.0, 40.0, 40.0, -40.0]]], requires_grad=True)
    alpha = expected_alignments(energy)
    (alpha * torch.arange(4.0)).sum().backward()
    assert energy.grad is not None and torch.isfinite(energy.grad).all()


def hard_reference(select: list[list[int]], length: int) -> list[int]:
    """Raffel et al.'s algorithm 1 on given decisions: from t_i-1 move right until z_ij = 1;
    ``length`` means nothing is attended (then, or ever after)."""
    chosen, t = [], 0
    for z in select:
        t = next((j for j in range(t, length) if z[j]), length)
        chosen.append(t)
    return chosen


def test_the_expectation_is_the_hard_process_when_probabilities_are_0_or_1() -> None:
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        z = torch.rand(1, 6, 8, generator=gen) < 0.3
        energy = torch.where(z, 60.0, -60.0).double()  # p is 0 or 1 to 26 digits
        alpha = expected_alignments(energy)[0]
        chosen = hard_reference(z[0].tolist(), 8)
        onehot = torch.zeros(6, 8, dtype=torch.float64)
        for i, j in enumerate(chosen):
            if j < 8:
                onehot[i, j] = 1.0
        torch.testing.assert_close(alpha, onehot, atol=1e-12, rtol=0)


def saturated_model(seed: int):  # noqa: ANN201
    """A tiny model whose monotonic energies are far from 0: p is 0 or 1 in float32."""
    model = tiny_model(seed=seed, cross_attention="monotonic", monotonic_noise=0.0)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, MonotonicAttention)
        attn.g.data.fill_(1e5)
        attn.r.data.fill_(0.0)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hard_attention_equals_the_expectation_when_probabilities_are_0_or_1(seed: int) -> None:
    model = saturated_model(seed)
    src = torch.tensor([[5, 6, 7, 8, 9, 4, EOS], [9, 4, 6, EOS, PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5, 6, 7, 8, 9, 10], [BOS, 8, 9, 10, 4, 5, 6, 7]])
    with torch.no_grad():
        expected = model.train()(src, tgt)
        hard = model.eval()(src, tgt)
        state = model.start(model.encode(src), beam=1)
        steps = torch.cat([model.decode(tgt[:, t : t + 1], state=state) for t in range(tgt.size(1))], 1)
    torch.testing.assert_close(hard, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(steps, expected, atol=1e-5, rtol=1e-5)
    # and the hard positions are those of the expected alignment's one-hot rows
    positions = state.cross[0].position  # type: ignore[attr-defined]
    assert positions is not None and positions.shape == (2,)


def test_hard_attention_moves_right_only_and_reads_linearly_many_positions(monkeypatch) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    attn = MonotonicAttention(8, noise=0.0, r_init=0.0).eval()
    attn.g.data.fill_(3.0)
    s, t = 200, 120
    memory = torch.randn(1, s, 8)
    state = attn.prepare(memory, torch.ones(1, s, dtype=torch.bool))
    inspected = 0
    energy = attn.energy

    def counting(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        nonlocal inspected
        out = energy(query, keys)
        inspected += out.numel()
        return out

    monkeypatch.setattr(attn, "energy", counting)
    positions = []
    with torch.no_grad():
        for _ in range(t):
            attn(torch.randn(1, 1, 8), state)
            assert state.position is not None
            positions.append(int(state.position[0]))
    assert positions == sorted(positions)
    assert positions[-1] > 20  # it did move through the source
    # each step inspects the positions it moves over plus at most one batch of SCAN
    assert inspected <= s + monotonic.SCAN * t


def test_a_source_with_no_selected_position_gives_zero_contexts() -> None:
    attn = MonotonicAttention(8, noise=0.0, r_init=-200.0).eval()
    memory = torch.randn(2, 5, 8)
    state = attn.prepare(memory, torch.ones(2, 5, dtype=torch.bool))
    with torch.no_grad():
        out = attn(torch.randn(2, 3, 8), state)
        torch.testing.assert_close(out, attn.out.bias.expand(2, 3, 8))
        assert state.position is not None and state.position.tolist() == [5, 5]
        soft = attn.train()(torch.randn(2, 3, 8), attn.prepare(memory, torch.ones(2, 5, dtype=torch.bool)))
        torch.testing.assert_close(soft, attn.out.bias.expand(2, 3, 8))


def test_the_energy_is_the_papers_weight_normalised_form() -> None:
    torch.manual_seed(0)
    attn = MonotonicAttention(6, dim=4, noise=0.0, r_init=-2.5)
    assert attn.g.item() == pytest.approx(0.5)  # 1 / sqrt(4)
    assert attn.r.item() == -2.5
    s, h = torch.randn(6), torch.randn(6)
    W, V, b = attn.query.weight, attn.key.weight, attn.key.bias
    v = attn.v
    by_hand = attn.g * (v / v.norm()) @ torch.tanh(W @ s + V @ h + b) + attn.r
    got = attn.energy(attn.query(s)[None, None], attn.key(h)[None, None])
    assert got.item() == pytest.approx(by_hand.item(), abs=1e-6)


def test_the_models_monotonic_heads_start_with_negative_r_and_g_one_over_root_dim() -> None:
    assert ModelConfig().monotonic_r_init < 0 and ModelConfig().monotonic_noise == 1.0
    model = tiny_model(cross_attention="monotonic", monotonic_dim=9)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        assert isinstance(attn, MonotonicAttention)
        assert attn.r.item() == ModelConfig().monotonic_r_init
        assert attn.g.item() == pytest.approx(1 / 3)
        assert attn.noise == 1.0


def test_noise_is_added_while_training_only() -> None:
    torch.manual_seed(0)
    attn = MonotonicAttention(8, noise=1.0, r_init=0.0)
    memory, mask = torch.randn(1, 6, 8), torch.ones(1, 6, dtype=torch.bool)
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        a = attn.train()(x, attn.prepare(memory, mask))
        b = attn(x, attn.prepare(memory, mask))
        assert not torch.allclose(a, b)
        attn.noise = 0.0
        torch.testing.assert_close(attn(x, attn.prepare(memory, mask)), attn(x, attn.prepare(memory, mask)))
        attn.noise = 1.0
        attn.eval()
        torch.testing.assert_close(attn(x, attn.prepare(memory, mask)), attn(x, attn.prepare(memory, mask)))


def test_one_step_of_the_expectation_matches_the_module() -> None:
    torch.manual_seed(3)
    attn = MonotonicAttention(8, noise=0.0, r_init=0.0).train()
    memory, mask = torch.randn(1, 5, 8), torch.ones(1, 5, dtype=torch.bool)
    x = torch.randn(1, 1, 8)
    with torch.no_grad():
        out = attn(x, attn.prepare(memory, mask))
        energy = attn.energy(attn.query(x), attn.key(memory))[:, 0]  # [1, S]
        alpha = expected_alignment(energy, torch.tensor([[1.0, 0, 0, 0, 0]]))
        torch.testing.assert_close(out[:, 0], attn.out(alpha @ memory[0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hard_attention_follows_the_papers_algorithm(seed: int) -> None:
    # Algorithm 1 with z_ij = [p_ij >= 0.5], on energies computed for every position at once
    torch.manual_seed(seed)
    attn = MonotonicAttention(8, noise=0.0, r_init=-0.3).eval()
    attn.g.data.fill_(2.0)
    lengths = [50, 23, 37]
    memory = torch.randn(3, 50, 8)
    mask = torch.arange(50)[None] < torch.tensor(lengths)[:, None]
    x = torch.randn(3, 30, 8)
    with torch.no_grad():
        state = attn.prepare(memory, mask)
        out = torch.cat([attn(x[:, :7], state), attn(x[:, 7:8], state), attn(x[:, 8:], state)], 1)
        energy = attn.energy(attn.query(x), attn.key(memory))  # [3, 30, 50]
    for n in range(3):
        chosen = hard_reference((energy[n] >= 0).tolist(), lengths[n])
        assert any(0 < j < lengths[n] for j in chosen)  # it moves, and not straight to the end
        expected = torch.stack([memory[n, j] if j < lengths[n] else torch.zeros(8) for j in chosen])
        torch.testing.assert_close(out[n], attn.out(expected), atol=1e-5, rtol=1e-5)


def test_padding_is_never_attended_even_where_it_would_be_selected() -> None:
    # keys chosen so that every real position has p < 0.5 and every padded one p > 0.5:
    # hard attention attends to nothing, and the expectation is that of the sentence alone
    torch.manual_seed(4)
    attn = MonotonicAttention(8, noise=0.0, r_init=0.0)
    memory = torch.randn(2, 6, 8)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    x = torch.randn(2, 4, 8)
    toward = 100 * torch.sign(attn.v.detach())  # tanh(q + toward) = sign(v): energy g ||v||_1 / ||v||
    with torch.no_grad():
        for train in (False, True):
            attn.train(train)
            state = attn.prepare(memory, mask)
            state.keys[:] = -toward
            state.keys[1, 3:] = toward
            assert (attn.energy(attn.query(x), state.keys)[1, :, 3:] > 0).all()
            out = attn(x, state)
            alone = attn.prepare(memory[1:, :3], mask[1:, :3])
            alone.keys[:] = -toward
            torch.testing.assert_close(out[1:], attn(x[1:], alone))
            if not train:
                torch.testing.assert_close(out[1], attn.out.bias.expand(4, 8))  # nothing attended
                assert state.position is not None and state.position.tolist() == [6, 3]
