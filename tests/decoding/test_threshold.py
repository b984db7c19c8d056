"""``decode.monotonic_threshold``: learned read/write policies decoded at another stopping
threshold. The reference: a head stops where sigmoid(e) >= tau, that is where
e - logit(tau) >= 0, so the same model with its energy bias lowered by logit(tau) (times
the temperature that divides it) decoded at the usual 0.5 must write the same tokens at
the same delays."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import tiny_model
from seqtrans.attention.monotonic import selecting
from seqtrans.config import DecodeConfig
from seqtrans.data.vocab import EOS
from seqtrans.decoding import generate
from seqtrans.errors import ConfigError
from seqtrans.model.transformer import Transformer
from seqtrans.streaming.decoder import stream_greedy

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5]]
CPU = torch.device("cpu")
POLICIES = ["monotonic", "milk", "mocha", "mma_hard", "mma_il", "mma_chunk"]


def policy_model(name: str, seed: int, r: float) -> Transformer:
    model = tiny_model(seed=seed, cross_attention=name, causal_encoder=True, monotonic_noise=0.0,
                       monotonic_temperature=0.5)
    for layer in model.decoder_layers:
        layer.cross_attn.r.data.fill_(r)
        if hasattr(layer.cross_attn, "g"):
            layer.cross_attn.g.data.fill_(3.0)
    return model.eval()


def shifted(model: Transformer, threshold: float) -> Transformer:
    """The model whose decisions at 0.5 are ``model``'s at ``threshold``."""
    other = copy.deepcopy(model)
    for layer in other.decoder_layers:
        attn = layer.cross_attn
        attn.r.data -= attn.temperature * math.log(threshold / (1 - threshold))
    return other


def streamed(model: Transformer, config: DecodeConfig) -> list[list[tuple[int, int]]]:
    return [[(e.token, e.delay) for e in stream_greedy(model, source, config)] for source in SOURCES]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("threshold", [0.2, 0.8])
def test_a_threshold_decodes_as_the_model_with_its_energy_bias_shifted(name: str, threshold: float) -> None:
    model = policy_model(name, seed=1, r=0.3)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3)
    at = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, monotonic_threshold=threshold)
    assert streamed(model, at) == streamed(shifted(model, threshold), config)
    offline = generate(model, [s + [EOS] for s in SOURCES], at, device=CPU)
    assert [[t for t, _ in row] for row in streamed(model, at)] == [h[0].tokens for h in offline]


@pytest.mark.parametrize("name", POLICIES)
def test_a_lower_threshold_writes_its_first_token_no_later(name: str) -> None:
    model = policy_model(name, seed=2, r=-0.5)
    first = {}
    for threshold in (0.1, 0.5, 0.9):
        config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, monotonic_threshold=threshold)
        first[threshold] = [row[0][1] if row else None for row in streamed(model, config)]
    for low, high in ((0.1, 0.5), (0.5, 0.9)):
        assert all(a <= b for a, b in zip(first[low], first[high]) if a is not None and b is not None)
    assert first[0.1] != first[0.9]  # the threshold changed some decision


@pytest.mark.parametrize("value", [0.0, 1.0, -0.1, float("nan")])
def test_a_threshold_outside_zero_one_is_a_config_error_naming_its_key(value: float) -> None:
    with pytest.raises(ConfigError, match="decode.monotonic_threshold"):
        DecodeConfig(monotonic_threshold=value)
    with pytest.raises(ValueError, match="threshold"):
        with selecting(value):
            pass
