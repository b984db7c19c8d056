"""Every attention mechanism at every site it supports: padding and batch-mates change
nothing, incremental decoding (with reordering) equals one pass, causality holds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conftest import assert_alone_as_among_others, assert_causal, src_batch, tiny_model
from seqtrans.attention import CROSS_ATTENTION, SELF_ATTENTION, cross_attention, self_attention
from seqtrans.config import CROSS_MECHANISMS, SELF_MECHANISMS, ModelConfig
from seqtrans.data.vocab import BOS, EOS
from seqtrans.model.transformer import Transformer

# options that make each mechanism's own behaviour visible on sequences of 3-6 tokens
SMALL = {"location_max_length": 12, "restricted_radius": 1, "local_window": 1, "memory_slots": 3,
         "monotonic_noise": 0.0}

SELF_CASES = [m for m in SELF_MECHANISMS if m != "scaled_dot"]
CROSS_CASES: list[tuple[str, dict[str, Any]]] = [
    ("dot", {}), ("general", {}), ("additive", {}), ("location", {}),
    ("local", {"local_alignment": "predictive"}), ("local", {"local_alignment": "monotonic"}),
    ("memory", {}), ("memory", {"memory_encoder_score": "sigmoid", "memory_decoder_score": "sigmoid",
                                "memory_positions": True}),
    ("memory", {"memory_positions": True}),
    ("memory", {"memory_decoder_score": "content", "memory_positions": True}),
    # r = 0.3 and g = 1: hard attention moves a few positions per step, neither stuck nor gone
    ("monotonic", {"monotonic_r_init": 0.3}),
    ("mocha", {"monotonic_r_init": 0.3}),
]


def cases() -> list[Any]:
    out = [pytest.param({}, id="scaled_dot")]
    for site in ("encoder_attention", "decoder_attention"):
        out += [pytest.param({site: m}, id=f"{site.split('_')[0]}-{m}") for m in SELF_CASES]
    out += [pytest.param({"cross_attention": m, **extra}, id=f"cross-{m}{'-' if extra else ''}"
                         + "-".join(str(v) for v in extra.values())) for m, extra in CROSS_CASES]
    return out


CASES = cases()


def build(options: dict[str, Any], *, seed: int = 0, train: bool = False) -> Transformer:
    model = tiny_model(seed=seed, **{**SMALL, **options})
    if options.get("cross_attention") == "monotonic":
        for layer in model.decoder_layers:
            layer.cross_attn.g.data.fill_(1.0)  # type: ignore[union-attr]
    return model.train(train)


def modes(options: dict[str, Any]) -> list[bool]:
    """Training mode too for monotonic attention, whose training computes something else."""
    return [False, True] if options.get("cross_attention") == "monotonic" else [False]


pytestmark = pytest.mark.usefixtures("no_grad")


def test_the_factory_builds_every_configured_mechanism() -> None:
    assert tuple(SELF_ATTENTION) == SELF_MECHANISMS
    assert tuple(CROSS_ATTENTION) == CROSS_MECHANISMS
    config = ModelConfig(d_model=16, heads=2, location_max_length=8)
    for name in SELF_MECHANISMS:
        assert hasattr(self_attention(name, config), "new_cache")
    for name in CROSS_MECHANISMS:
        assert hasattr(cross_attention(name, config), "prepare")
    with pytest.raises(ValueError, match="known: scaled_dot"):
        self_attention("memory", config)


def test_each_site_gets_its_mechanism() -> None:
    model = tiny_model(encoder_attention="restricted", decoder_attention="additive", cross_attention="memory")
    assert type(model.encoder[0].self_attn).__name__ == "RestrictedSelfAttention"
    assert type(model.decoder_layers[0].self_attn.score).__name__ == "AdditiveScore"  # type: ignore[attr-defined]
    assert type(model.decoder_layers[1].cross_attn).__name__ == "MemoryAttention"


@pytest.mark.parametrize("options", CASES)
def test_padding_and_batch_mates_change_nothing(options: dict[str, Any]) -> None:
    for train in modes(options):
        assert_alone_as_among_others(build(options, train=train))


@pytest.mark.parametrize("options", CASES)
def test_future_target_tokens_do_not_change_earlier_outputs(options: dict[str, Any]) -> None:
    for train in modes(options):
        assert_causal(build(options, train=train), change_seen=False)


@pytest.mark.parametrize("options", CASES)
def test_incremental_decoding_equals_one_pass(options: dict[str, Any]) -> None:
    for train in modes(options):
        model = build(options, train=train)
        src = src_batch()
        tgt = torch.tensor([[BOS, 4, 5, 6, 7, 8], [BOS, 8, 9, 10, 4, 5]])
        full = model(src, tgt)
        state = model.start(model.encode(src), beam=1, capacity=2)  # the cache grows past its capacity
        steps = [model.decode(tgt[:, t : t + 1], state=state) for t in range(tgt.size(1))]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
        state = model.start(model.encode(src), beam=1, capacity=8)  # several tokens at once
        first = model.decode(tgt[:, :3], state=state)
        rest = model.decode(tgt[:, 3:], state=state)
        torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", CASES)
def test_state_follows_reordered_and_dropped_hypotheses(options: dict[str, Any]) -> None:
    for train in modes(options):
        model = build(options, train=train)
        src = src_batch()  # 2 sentences, beam 3 -> 6 rows
        state = model.start(model.encode(src), beam=3, capacity=8)
        hist = torch.tensor([[BOS, 4], [BOS, 5], [BOS, 6], [BOS, 7], [BOS, 8], [BOS, 9]])
        model.decode(hist[:, :1], state=state)
        model.decode(hist[:, 1:2], state=state)
        rows = torch.tensor([2, 0, 0, 5, 3, 4])  # hypotheses stay within their sentence
        state.reorder(rows)
        hist = torch.cat([hist[rows], torch.full((6, 1), 10)], dim=1)
        step = model.decode(hist[:, 2:3], state=state)
        full = model(src.repeat_interleave(3, dim=0), hist)
        torch.testing.assert_close(step[:, 0], full[:, 2], atol=1e-5, rtol=1e-5)
        # sentence 0 finishes: keep only sentence 1's rows
        state.reorder(torch.tensor([3, 4, 5]), torch.tensor([1]))
        hist = torch.cat([hist[3:], torch.full((3, 1), 4)], dim=1)
        step = model.decode(hist[:, 3:4], state=state)
        full = model(src[1:].repeat_interleave(3, dim=0), hist)
        torch.testing.assert_close(step[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mechanism", SELF_MECHANISMS)
def test_a_causal_encoder_never_sees_later_source_tokens(mechanism: str) -> None:
    model = build({"encoder_attention": mechanism, "causal_encoder": True})
    src = torch.tensor([[5, 6, 7, 8, 9, EOS]])
    base = model.encode(src).memory
    for s in range(1, src.size(1)):
        changed = src.clone()
        changed[:, s:] = torch.randint(4, 11, changed[:, s:].shape)
        torch.testing.assert_close(model.encode(changed).memory[:, :s], base[:, :s], atol=1e-6, rtol=0)
    bidirectional = build({"encoder_attention": mechanism})
    changed = src.clone()
    changed[:, 1] = 4
    before, after = bidirectional.encode(src).memory, bidirectional.encode(changed).memory
    assert not torch.allclose(after[:, 0], before[:, 0])
