"""Label-smoothed cross-entropy against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from seqtrans.training.loss import label_smoothed_loss
from seqtrans.vocab import PAD


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
