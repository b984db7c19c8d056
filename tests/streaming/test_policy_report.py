"""The read-policy report (seqtrans.streaming.policy) against hand-computed values: a
policy undecided everywhere (p = 0.5), at the paper's threshold and above it, and one
whose probabilities are 0 or 1."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from seqtrans.attention.monotonic import selecting
from seqtrans.data.vocab import BOS, EOS
from seqtrans.model.transformer import Transformer
from seqtrans.streaming.policy import policy_report


def flat(name: str) -> Transformer:
    """Every energy 0: every selection probability is exactly 0.5."""
    model = tiny_model(seed=0, cross_attention=name, causal_encoder=True)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        attn.r.data.fill_(0.0)  # type: ignore[union-attr]
        if name == "monotonic":
            attn.g.data.fill_(0.0)  # type: ignore[union-attr]
        else:
            attn.q_mono.weight.data.zero_()  # type: ignore[union-attr]
            attn.q_mono.bias.data.zero_()  # type: ignore[union-attr]
    return model


# one step over 3 positions, p = 0.5: alpha = (1/2, 1/4, 1/8), 1/8 left unselected. Hard
# decisions stop at position 0 (p >= 0.5). Raffel's attention leaves the 1/8 at "nothing"
# (position 3): mean stop 1/4 + 2/8 + 3/8 = 7/8; MMA gives it to the last position: 1/4 + 2/4.
@pytest.mark.parametrize("name, gap", [("monotonic", 7 / 8), ("mma_hard", 3 / 4), ("mma_il", 3 / 4)])
def test_an_undecided_policy_against_hand_computed_values(name: str, gap: float) -> None:
    report = policy_report(flat(name), [(torch.tensor([[4, 5, EOS]]), torch.tensor([[BOS]]))])
    assert [r.layer for r in report] == [1, 2]
    for r in report:
        assert r.heads == (1 if name == "monotonic" else 4)
        assert r.undecided == 1.0
        assert r.gap == pytest.approx(gap)
        assert r.agreement == pytest.approx(0.5)
        assert r.ahead == pytest.approx(-gap)  # the hard decision stops first
        assert r.nothing == 0.0
        assert r.histogram == tuple(1.0 if i == 5 else 0.0 for i in range(10))  # every p is 0.5


# The same policy decoded at the threshold 0.6: no p reaches it, so the hard decision reads
# the whole source. Raffel's attention then selects nothing (position 3, 3 - 7/8 past the
# expected stop); MMA's head stops at the last position (2 - 3/4). The expected alignment,
# like the probabilities, does not depend on the threshold.
@pytest.mark.parametrize("name, ahead, nothing", [("monotonic", 3 - 7 / 8, 1.0), ("mma_hard", 2 - 3 / 4, 0.0),
                                                   ("mma_il", 2 - 3 / 4, 0.0)])
def test_a_threshold_above_every_probability_reads_the_whole_source(name: str, ahead: float,
                                                                     nothing: float) -> None:
    with selecting(0.6):
        report = policy_report(flat(name), [(torch.tensor([[4, 5, EOS]]), torch.tensor([[BOS]]))])
    for r in report:
        assert r.ahead == pytest.approx(ahead) and r.gap == pytest.approx(ahead)
        assert r.nothing == nothing
        assert r.undecided == 1.0 and r.histogram[5] == 1.0


@pytest.mark.parametrize("name", ["monotonic", "milk", "mocha", "mma_hard", "mma_il"])
def test_the_first_layer_reads_no_less_as_the_threshold_rises(name: str) -> None:
    """The first layer's queries do not depend on any hard decision (the layers above
    read the contexts of those below), so its stops can only move right as the threshold
    rises, and the expected stops not at all."""
    model = tiny_model(seed=4, cross_attention=name, causal_encoder=True, monotonic_r_init=0.0)
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 4, 5, EOS], [8, 9, 4, 5, EOS, 0, 0, 0, 0]])
    tgt = torch.tensor([[BOS, 4, 5, 6, 7, 8], [BOS, 8, 9, 0, 0, 0]])
    firsts = []
    for threshold in (0.2, 0.5, 0.8):
        with selecting(threshold):
            firsts.append(policy_report(model, [(src, tgt)])[0])
    assert firsts[0].ahead <= firsts[1].ahead <= firsts[2].ahead
    assert firsts[0].ahead < firsts[2].ahead  # the random policy's p are not all outside (0.2, 0.8)
    assert firsts[0].histogram == firsts[2].histogram


@pytest.mark.parametrize("name", ["monotonic", "mma_hard"])
def test_a_policy_with_probabilities_0_or_1_has_no_gap(name: str) -> None:
    model = tiny_model(seed=1, cross_attention=name, causal_encoder=True)
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        if name == "monotonic":
            attn.g.data.fill_(1e4)  # type: ignore[union-attr]
        else:
            attn.q_mono.weight.data.mul_(1e7)  # type: ignore[union-attr]
            attn.q_mono.bias.data.fill_(0.0)  # type: ignore[union-attr]
        attn.r.data.fill_(0.3)  # type: ignore[union-attr]
    src = torch.tensor([[4, 5, 6, 7, EOS], [8, 9, EOS, 0, 0]])
    tgt = torch.tensor([[BOS, 4, 5, 6], [BOS, 8, 0, 0]])
    report = policy_report(model, [(src, tgt)])
    assert len(report) == 2
    for r in report:
        assert r.undecided == 0.0
        assert r.gap == pytest.approx(0.0, abs=1e-6)
        assert r.agreement == pytest.approx(1.0, abs=1e-6)


def test_layers_without_a_monotonic_policy_are_left_out() -> None:
    assert policy_report(tiny_model(seed=0), [(torch.tensor([[4, EOS]]), torch.tensor([[BOS]]))]) == []


@pytest.mark.parametrize("name", ["monotonic", "milk", "mocha", "mma_hard", "mma_il", "mma_chunk"])
def test_a_temperature_below_1_sharpens_the_probabilities_and_keeps_the_decisions(name: str) -> None:
    src = torch.tensor([[4, 5, 6, 7, 8, 9, EOS], [8, 9, 10, EOS, 0, 0, 0]])
    tgt = torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 8, 9, 0, 0]])
    reports, outputs = [], []
    for temperature in (1.0, 0.05):
        model = tiny_model(seed=2, cross_attention=name, causal_encoder=True, monotonic_r_init=0.0,
                           monotonic_temperature=temperature)
        outputs.append(model(src, tgt))
        reports.append(policy_report(model, [(src, tgt)]))
    assert torch.equal(outputs[0], outputs[1])  # the same hard decisions, the same outputs
    for warm, cold in zip(*reports):
        assert cold.undecided < warm.undecided
        assert cold.gap < warm.gap and cold.agreement > warm.agreement


@pytest.mark.parametrize("name", ["monotonic", "milk", "mocha", "mma_hard", "mma_il", "mma_chunk"])
def test_the_noise_is_applied_in_every_layer_while_training_only(name: str) -> None:
    """Training with noise in one layer alone changes the loss, whichever layer it is."""
    src = torch.tensor([[4, 5, 6, 7, EOS]])
    tgt = torch.tensor([[BOS, 4, 5, 6]])
    model = tiny_model(seed=3, cross_attention=name, causal_encoder=True, monotonic_r_init=0.0)
    attns = [layer.cross_attn for layer in model.decoder_layers]
    for noisy in range(len(attns)):
        for i, attn in enumerate(attns):
            attn.noise = 1.0 if i == noisy else 0.0  # type: ignore[union-attr]
        model.train()
        assert not torch.equal(model(src, tgt), model(src, tgt))
        model.eval()
        assert torch.equal(model(src, tgt), model(src, tgt))
    for attn in attns:
        attn.noise = 0.0  # type: ignore[union-attr]
    model.train()
    assert torch.equal(model(src, tgt), model(src, tgt))  # dropout is 0: only the noise varies
