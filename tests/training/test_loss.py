"""Label-smoothed cross-entropy against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from seqtrans.data.vocab import PAD
from seqtrans.training.loss import label_smoothed_loss


def test_smoothed_loss_matches_a_hand_computation() -> None:
    # p = (0.5, 0.25, 0.25) over a 3-symbol vocabulary, reference symbol 0, eps = 0.1:
    # 0.9 * -ln 0.5 + 0.1 * (ln 2 + ln 4 + ln 4) / 3 = 0.623832 + 0.115525
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    loss, nll = label_smoothed_loss(logits, torch.tensor([[0]]), smoothing=0.1, ignore_index=-100)
    assert float(loss) == pytest.approx(0.739357, abs=1e-6)
    assert float(nll) == pytest.approx(math.log(2), abs=1e-6)


def test_padding_positions_contribute_nothing() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 9)
    target = torch.tensor([[5, 6, 7, PAD], [8, PAD, PAD, PAD]])
    loss, nll = label_smoothed_loss(logits, target, smoothing=0.1)
    changed = logits.clone()
    changed[0, 3] = 100.0
    changed[1, 1:] = -50.0
    loss2, nll2 = label_smoothed_loss(changed, target, smoothing=0.1)
    assert float(loss) == pytest.approx(float(loss2))
    assert float(nll) == pytest.approx(float(nll2))
    # and the sum agrees with torch's own label smoothing
    ref = F.cross_entropy(logits.view(-1, 9), target.view(-1), ignore_index=PAD, label_smoothing=0.1,
                          reduction="sum")
    assert float(loss) == pytest.approx(float(ref), rel=1e-6)


def test_no_smoothing_is_plain_cross_entropy() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 7)
    target = torch.randint(1, 7, (3, 5))
    loss, nll = label_smoothed_loss(logits, target, smoothing=0.0)
    assert float(loss) == pytest.approx(float(nll))
    assert float(nll) == pytest.approx(float(F.cross_entropy(logits.view(-1, 7), target.view(-1),
                                                             reduction="sum")), rel=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_projected_loss_equals_projecting_first_with_the_same_gradients(smoothing: float,
                                                                        monkeypatch) -> None:
    from seqtrans.training import loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 3 * 11)  # several chunks of 3 rows
    torch.manual_seed(2)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    target = torch.tensor([[4, 5, 6, 2, PAD], [7, 2, PAD, PAD, PAD]])
    ref_loss, ref_nll = label_smoothed_loss(hidden @ weight.t(), target, smoothing=smoothing)
    (ref_loss * 0.5).backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    loss, nll = loss_module.projected_label_smoothed_loss(hidden, weight, target, smoothing=smoothing)
    (loss * 0.5).backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    torch.testing.assert_close(hidden.grad, ref_grads[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weight.grad, ref_grads[1], atol=1e-6, rtol=1e-5)


def test_projected_loss_without_gradients() -> None:
    from seqtrans.training.loss import projected_label_smoothed_loss

    torch.manual_seed(3)
    hidden, weight = torch.randn(3, 4, 8), torch.randn(9, 8)
    target = torch.randint(1, 9, (3, 4))
    with torch.no_grad():
        loss, nll = projected_label_smoothed_loss(hidden, weight, target, smoothing=0.1)
    ref, ref_nll = label_smoothed_loss(hidden @ weight.t(), target, smoothing=0.1)
    assert float(loss) == pytest.approx(float(ref), rel=1e-6) and float(nll) == pytest.approx(float(ref_nll))


def test_projected_loss_with_an_output_bias_has_the_bias_gradient(monkeypatch) -> None:
    from seqtrans.training import loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 2 * 11)
    torch.manual_seed(4)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    bias = torch.randn(11, requires_grad=True)
    target = torch.tensor([[4, 5, 6, 2, PAD], [7, 2, PAD, PAD, PAD]])
    ref_loss, ref_nll = label_smoothed_loss(hidden @ weight.t() + bias, target, smoothing=0.1)
    ref_loss.backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone(), bias.grad.clone()
    hidden.grad = weight.grad = bias.grad = None
    loss, nll = loss_module.projected_label_smoothed_loss(hidden, weight, target, bias=bias, smoothing=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    for got, want in zip((hidden.grad, weight.grad, bias.grad), ref_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
