"""The CPU dropout mask: its rate, independence, scale and gradient."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from seqtrans.config import ModelConfig
from seqtrans.model.dropout import Dropout, dropout, keep_mask
from seqtrans.model.transformer import Transformer

N = 1 << 20


@pytest.mark.parametrize("p", [0.1, 0.2, 0.3, 0.5, 0.9])
def test_rate_of_every_lane_and_pairs(p: float) -> None:
    torch.manual_seed(0)
    keep, scale = keep_mask((N,), p)
    q = round(p * 65536) / 65536  # the rate actually used
    assert abs(q - p) <= 2**-17
    assert scale == pytest.approx(1 / (1 - q), rel=1e-12)
    dropped = (~keep).double()
    # each of the four 16-bit lanes of a 64-bit draw, on its own (a sign bit that is
    # never set would bias one lane)
    for lane in range(4):
        rate = float(dropped[lane::4].mean())
        assert abs(rate - q) < 5 * math.sqrt(q * (1 - q) / (N / 4)), (lane, rate)
    # neighbours (same draw) and elements four apart (next draw) are independent
    for step in (1, 4):
        both = float((dropped[:-step] * dropped[step:]).mean())
        assert abs(both - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / N), (step, both)


def test_expectation_is_kept_and_gradient_uses_the_same_mask() -> None:
    torch.manual_seed(1)
    x = torch.ones(512, 512, requires_grad=True)
    y = dropout(x, 0.2)
    kept = y != 0
    assert torch.all(y[kept] == y[kept][0])  # one scale
    assert float(y.detach().mean()) == pytest.approx(1.0, abs=5 * math.sqrt(0.25 / x.numel()))
    g = torch.randn(512, 512)
    y.backward(g)
    assert x.grad is not None
    assert torch.equal(x.grad, g * y.detach())  # y = mask * scale for x = 1


def test_seeded_masks_repeat_and_identity_cases() -> None:
    x = torch.randn(64, 33)
    torch.manual_seed(7)
    a = dropout(x, 0.3)
    torch.manual_seed(7)
    assert torch.equal(a, dropout(x, 0.3))
    assert torch.equal(dropout(x, 0.3, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.count_nonzero(dropout(x, 1.0)) == 0


def test_module_is_an_nn_dropout_without_state() -> None:
    layer = Dropout(0.25)
    assert isinstance(layer, nn.Dropout) and not layer.state_dict()
    x = torch.randn(100, 8)
    assert torch.equal(layer.eval()(x), x)
    model = Transformer(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2),
                        source_vocab_size=20, target_vocab_size=20, shared_vocab=True)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(isinstance(m, Dropout) for m in dropouts)
