"""A read policy fine-tuned from a trained full-sentence model (``run --init`` with another
``model.cross_attention``, as EMMA does): every weight but the encoder-decoder attention's
is the full model's, MILk's soft heads start as its scaled-dot attention, the read policy
starts new; what cannot start from it is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_cli import TINY

from seqtrans import Initial, initial, resolve_config, run, with_initial_model
from seqtrans.errors import UsageError
from seqtrans.inference.loading import load
from seqtrans.training import initial as initial_model

CAUSAL = ["model.causal_encoder=true"]


def _run(out: Path, *extra: str, init: Path | None = None) -> Path:
    overrides = [*TINY, *CAUSAL, "train.max_steps=2", "train.eval_every=2", "train.checkpoint_every=2",
                 "train.average_last=1", "model.dropout=0.0", *extra]
    config = resolve_config("copy", overrides=overrides)
    start = None
    if init is not None:
        start = initial(init)
        config = with_initial_model(config, start, overrides)
    run(config, out, device="cpu", init=start)
    return out


def _started(out: Path, monkeypatch: pytest.MonkeyPatch, *extra: str, init: Path) -> dict[str, torch.Tensor]:
    """The weights a run started from ``init`` has before its first update."""
    seen: dict[str, torch.Tensor] = {}
    original = initial_model.start_from

    def started(model: torch.nn.Module, start: Initial) -> None:
        original(model, start)  # type: ignore[arg-type]
        seen.update({k: v.clone() for k, v in model.state_dict().items()})

    monkeypatch.setattr(initial_model, "start_from", started)
    _run(out, *extra, "train.max_steps=1", init=init)
    return seen


def test_milk_starts_from_a_full_sentence_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = _run(tmp_path / "full")
    weights = {k: v.clone() for k, v in load(full, device="cpu").model.state_dict().items()}
    seen = _started(tmp_path / "milk", monkeypatch, "model.cross_attention=milk", init=full)
    for name, value in seen.items():
        if ".cross_attn." not in name:
            assert torch.equal(value, weights[name]), name  # the full model's
    layer = "decoder.0.cross_attn."
    for mine, theirs in [("soft_q", "q"), ("soft_kv", "kv"), ("out", "out")]:
        for part in ("weight", "bias"):
            assert torch.equal(seen[f"{layer}{mine}.{part}"], weights[f"{layer}{theirs}.{part}"])
    assert seen[f"{layer}r"].item() == -4.0  # the read policy is new: its initial energy bias


def test_mma_il_starts_from_a_full_sentence_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = _run(tmp_path / "full")
    weights = {k: v.clone() for k, v in load(full, device="cpu").model.state_dict().items()}
    seen = _started(tmp_path / "mma", monkeypatch, "model.cross_attention=mma_il", init=full)
    layer = "decoder.0.cross_attn."
    keys, values = weights[f"{layer}kv.weight"].chunk(2, dim=0)
    assert torch.equal(seen[f"{layer}q_soft.weight"], weights[f"{layer}q.weight"])
    assert torch.equal(seen[f"{layer}k_soft.weight"], keys)
    assert torch.equal(seen[f"{layer}v.weight"], values)
    assert torch.equal(seen[f"{layer}out.weight"], weights[f"{layer}out.weight"])
    assert seen[f"{layer}r"].item() == -4.0  # the monotonic heads are new


def test_a_policy_can_start_only_from_a_scaled_dot_model(tmp_path: Path) -> None:
    monotonic = _run(tmp_path / "monotonic", "model.cross_attention=monotonic")
    with pytest.raises(UsageError, match="model.cross_attention=monotonic can start only"):
        _run(tmp_path / "milk", "model.cross_attention=milk", init=monotonic)
