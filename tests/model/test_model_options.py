"""The model options beyond the paper's architecture (activation, sinusoid layout,
embedding scale and norm, output bias): each computes what its help text says, and
leaving them at their defaults builds the paper's model with the same parameters."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_causal, src_batch, tiny_model
from seqtrans.data.vocab import BOS
from seqtrans.model.transformer import FeedForward

pytestmark = pytest.mark.usefixtures("no_grad")

ALL_ON = {"activation": "silu", "sinusoid_layout": "split", "scale_embeddings": False,
          "embedding_norm": True, "output_bias": True}


def test_defaults_add_no_parameters() -> None:
    names = set(tiny_model().state_dict())
    assert not any("embedding_norm" in n or "output_bias" in n for n in names)
    assert {"embedding_norm.weight", "output_bias"} <= set(tiny_model(**ALL_ON).state_dict())


def test_split_sinusoids_put_sines_first_and_cosines_after() -> None:
    model = tiny_model(sinusoid_layout="split")
    pe = model.positions(4, offset=2, device=torch.device("cpu"))  # [4, 16]
    for pos in range(2, 6):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos - 2, i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos - 2, 8 + i].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("activation, reference", [
    ("relu", lambda x: x.clamp(min=0)),
    ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
    ("silu", lambda x: x / (1 + torch.exp(-x))),
])
def test_feed_forward_activation(activation: str, reference) -> None:
    torch.manual_seed(0)
    ffn = FeedForward(8, 12, dropout=0.0, activation=activation)
    x = torch.randn(3, 8)
    expected = reference(x @ ffn.inner.weight.t() + ffn.inner.bias) @ ffn.outer.weight.t() + ffn.outer.bias
    torch.testing.assert_close(ffn(x), expected, atol=1e-6, rtol=1e-5)


def test_unscaled_embeddings_with_a_norm() -> None:
    model = tiny_model(scale_embeddings=False, embedding_norm=True)
    tokens = torch.tensor([[5, 6, 7]])
    summed = model.source_embed.weight[tokens] + model.positions(3, device=tokens.device)
    expected = F.layer_norm(summed, (16,), model.embedding_norm.weight, model.embedding_norm.bias)
    torch.testing.assert_close(model._embed(model.source_embed, tokens, 0, source=True), expected)


def test_output_bias_is_added_to_every_logit() -> None:
    model = tiny_model(output_bias=True)
    src, tgt = src_batch(), torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    without = model(src, tgt)
    model.output_bias.copy_(torch.arange(11, dtype=torch.float32))
    torch.testing.assert_close(model(src, tgt), without + torch.arange(11, dtype=torch.float32))


def test_a_fixed_output_bias_is_saved_and_added_but_not_trained() -> None:
    model = tiny_model(output_bias=True, fixed_output_bias=True)
    assert "output_bias" in model.state_dict()
    assert all(p is not model.output_bias for p in model.parameters())  # no optimizer sees it
    src, tgt = src_batch(), torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    without = model(src, tgt)
    model.output_bias.copy_(torch.arange(11, dtype=torch.float32))
    torch.testing.assert_close(model(src, tgt), without + torch.arange(11, dtype=torch.float32))


def test_every_option_on_keeps_the_model_causal_and_the_cache_exact() -> None:
    model = tiny_model(**ALL_ON)
    with torch.no_grad():
        model.output_bias.normal_()
    assert_causal(model)
    src = src_batch()
    tgt = torch.tensor([[BOS, 4, 5, 6], [BOS, 5, 4, 7]])
    full = model(src, tgt)
    state = model.start(model.encode(src), beam=1, capacity=8)
    steps = [model.decode(tgt[:, t : t + 1], state=state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
