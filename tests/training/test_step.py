"""The update step: accumulated gradients against one batch of the union, the step a
plain SGD optimizer takes at the schedule's rate (clipped and not), and the policy for
updates that cannot be taken, against hand-computed counts and messages."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from seqtrans.config import ModelConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import TrainingError
from seqtrans.model.transformer import Transformer
from seqtrans.training import step as step_module
from seqtrans.training.progress import Progress
from seqtrans.training.schedule import Schedule
from seqtrans.training.step import LossModule, UpdateStep, overflowed, resolve_precision, skip
from seqtrans.training.world import SINGLE

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0)
PAIRS = Pairs([[4 + i % 7] * (1 + i % 3) + [2] for i in range(8)],
              [[4 + i % 7] * (1 + i % 4) for i in range(8)], kept=[10 + i for i in range(8)])
SCHEDULE = Schedule(d_model=16, warmup=4, max_steps=100)
TOKENS = sum(len(t) + 1 for t in PAIRS.tgt)


def update_step(**train: object) -> tuple[UpdateStep, Transformer]:
    """A step of a fixed model, applied by SGD (whose update is easy to write by hand)."""
    torch.manual_seed(0)
    model = Transformer(MODEL, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return UpdateStep(net=LossModule(model, 0.1, "fp32"), model=model, optimizer=optimizer,
                      scaler=torch.amp.GradScaler("cpu", enabled=False), schedule=SCHEDULE,
                      train=TrainConfig(**train), world=SINGLE, device=torch.device("cpu")), model  # type: ignore[arg-type]


def reference_gradients(model: Transformer, indices: np.ndarray) -> dict[str, torch.Tensor]:
    """The gradient of the loss per target token of one batch holding all ``indices``."""
    model.zero_grad(set_to_none=True)
    batch = PAIRS.batch(indices)
    loss, _ = LossModule(model, 0.1, "fp32")(batch.src, batch.tgt_in, batch.tgt_out)
    (loss / batch.target_tokens).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("accumulate,parts", [(1, 1), (2, 1), (2, 4), (3, 2)])
def test_accumulated_gradients_are_those_of_one_batch_of_the_union(accumulate: int, parts: int) -> None:
    step, model = update_step(accumulate=accumulate)
    group = np.array_split(np.arange(8), accumulate)
    total, mine = step.gradients(group, pairs=PAIRS, tokens=TOKENS, parts=parts)
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    expected = reference_gradients(model, np.arange(8))
    assert mine == TOKENS
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    batch = PAIRS.batch(np.arange(8))
    whole, _ = LossModule(model, 0.1, "fp32")(batch.src, batch.tgt_in, batch.tgt_out)
    assert total == pytest.approx(float(whole.detach()), rel=1e-5)


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_the_update_is_sgd_at_the_schedules_rate_on_the_clipped_gradient(clip: float) -> None:
    step, model = update_step(clip_norm=clip)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = reference_gradients(model, np.arange(8))
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))
    progress = Progress(step=2)
    step([np.arange(8)], pairs=PAIRS, tokens=TOKENS, progress=progress)
    lr = 16**-0.5 * 3 * 4**-1.5  # update 3 of a 4-update warm-up
    scale = min(1.0, clip / (norm + 1e-6)) if clip else 1.0
    assert progress.step == 3 and step.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    for name, p in model.named_parameters():
        expected = before[name] - lr * scale * grads[name] if name in grads else before[name]
        torch.testing.assert_close(p.detach(), expected, rtol=1e-4, atol=1e-7, msg=name)


def test_a_not_finite_update_is_skipped_and_the_next_good_one_resets_the_count(caplog) -> None:
    step, model = update_step(max_skipped=3)
    progress = Progress(step=4, skipped_in_row=1, skipped_updates=1)
    with torch.no_grad():
        model.target_embed.weight[5, 0] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        step([np.arange(8)], pairs=PAIRS, tokens=TOKENS, progress=progress)
    assert "update 5 skipped: its loss is not finite (2 in a row)" in caplog.text
    assert (progress.step, progress.skipped_updates, progress.skipped_in_row) == (4, 2, 2)
    assert all(p.grad is None for p in model.parameters())  # nothing left to leak into the next update
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]) or not torch.isfinite(before[name]).all(), name
    with torch.no_grad():
        model.target_embed.weight[5, 0] = 0.0
    step([np.arange(8)], pairs=PAIRS, tokens=TOKENS, progress=progress)
    assert (progress.step, progress.skipped_updates, progress.skipped_in_row) == (5, 2, 0)


def test_the_last_skip_allowed_names_the_update_its_epoch_and_its_examples() -> None:
    progress = Progress(step=20, epoch=3, skipped_in_row=2)
    group = [np.array([6, 2]), np.array([7, 0, 1, 5])]
    with pytest.raises(TrainingError) as caught:
        skip(progress, "loss is not finite", group=group, kept=PAIRS.kept, max_skipped=3)
    assert str(caught.value).startswith(
        "update 21: 3 updates in a row were skipped (train.max_skipped), the last because its loss is not "
        "finite; its batch, epoch 3, held 6 training examples, the first at positions [16, 12, 17, 10, 11] ")
    assert progress.skipped_updates == 1 and progress.step == 20
    untracked = Progress(skipped_in_row=0)
    with pytest.raises(TrainingError, match=r"positions \[6, 2\] of"):  # without kept: the indices
        skip(untracked, "why", group=[np.array([6, 2])], kept=[], max_skipped=1)


def test_an_fp16_overflow_is_counted_and_a_vanishing_scale_stops_the_run(caplog) -> None:
    progress = Progress(step=9, skipped_updates=4)
    with caplog.at_level(logging.WARNING):
        overflowed(progress, 1024.0, 512.0)
    assert "update 10 skipped: fp16 gradients overflowed at loss scale 1024 (now 512)" in caplog.text
    assert progress.skipped_updates == 5 and progress.step == 9
    with pytest.raises(TrainingError, match="the fp16 loss scale fell to 5e-05 after 6 skipped updates"):
        overflowed(progress, 1e-4, step_module.MIN_LOSS_SCALE / 2)


def test_precision_auto_is_fp32_off_a_gpu_and_named_ones_stay() -> None:
    cpu = torch.device("cpu")
    assert [resolve_precision(p, cpu) for p in ("auto", "fp32", "bf16", "fp16")] == \
        ["fp32", "fp32", "bf16", "fp16"]
