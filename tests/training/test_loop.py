"""The training loop: exact resumption, gradient accumulation, stopping rules."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import TrainingError
from seqtrans.model.transformer import Transformer
from seqtrans.training import checkpoint
from seqtrans.training.loop import Trainer

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.2)


def copy_pairs(n: int, seed: int = 0) -> Pairs:
    rng = random.Random(seed)
    seqs = [[rng.randrange(4, 12) for _ in range(rng.randint(1, 8))] for _ in range(n)]
    return Pairs([s + [2] for s in seqs], seqs)


def trainer(tmp: Path, *, data: Pairs, seed: int = 0, **train: object) -> Trainer:
    options = {"max_tokens": 64, "warmup": 10, "checkpoint_every": 5, "eval_every": 1000,
               "keep_checkpoints": 5, "average_last": 1, "log_every": 1000, **train}
    config = RunConfig(task="test", model=MODEL, train=TrainConfig(**options), seed=3)
    torch.manual_seed(seed)  # a different initialisation each time: resume must overwrite it
    model = Transformer(MODEL, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    return Trainer(model, config, data, directory=tmp, device=torch.device("cpu"))


def test_an_interrupted_and_resumed_run_gives_the_same_losses(tmp_path: Path) -> None:
    data = copy_pairs(40)  # a few batches per epoch, so the run crosses epoch boundaries
    whole = trainer(tmp_path / "whole", data=data, max_steps=14).fit()
    assert whole.progress.epoch > 2
    first = trainer(tmp_path / "split", data=data, max_steps=7).fit()
    second = trainer(tmp_path / "split", data=data, seed=99, max_steps=14).fit()
    assert first.losses + second.losses == whole.losses
    assert second.progress.step == 14
    a = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "whole")[-1])["model"]
    b = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "split")[-1])["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resampled_sources_are_used_per_epoch_and_survive_resumption(tmp_path: Path) -> None:
    data = copy_pairs(40)
    epochs: list[int] = []

    def resample(epoch: int) -> list[list[int]]:  # each epoch repeats some sources' tokens
        epochs.append(epoch)
        return [s[:-1] * (1 + (i + epoch) % 2) + [2] for i, s in enumerate(data.src)]

    def run(directory: str, steps: int, seed: int = 0) -> Trainer:
        t = trainer(tmp_path / directory, data=data, seed=seed, max_steps=steps)
        t.resample = resample
        t.fit()
        return t

    whole = run("whole", 14)
    assert epochs == list(range(1, whole.state.epoch + 1)) and whole.state.epoch > 2
    assert whole.train_data.src == resample(whole.state.epoch) and whole.train_data.tgt == data.tgt
    plain = trainer(tmp_path / "plain", data=data, max_steps=14).fit()
    run("split", 7)
    second = run("split", 14, seed=99)
    a = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "whole")[-1])["model"]
    b = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "split")[-1])["model"]
    c = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "plain")[-1])["model"]
    assert second.state.step == 14
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not all(torch.equal(a[name], c[name]) for name in a)  # the resampled data was trained on
    assert plain.progress.step == 14


def test_batches_are_deterministic_for_a_seed(tmp_path: Path) -> None:
    data = copy_pairs(40)
    one = trainer(tmp_path / "a", data=data, max_steps=5).fit()
    two = trainer(tmp_path / "b", data=data, max_steps=5).fit()
    assert one.losses == two.losses


def test_accumulated_batches_give_the_gradient_of_their_union(tmp_path: Path) -> None:
    data = copy_pairs(8)
    t = trainer(tmp_path, data=data, max_steps=1, accumulate=2)
    t.model.eval()  # no dropout, so both ways see the same function
    t.model.train = lambda mode=True: t.model  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    t._update([np.array([0, 1, 2]), np.array([3, 4, 5, 6, 7])])
    accumulated = {n: p.grad.clone() for n, p in t.model.named_parameters()}
    t.model.load_state_dict(before)
    t._update([np.arange(8)])
    for n, p in t.model.named_parameters():
        torch.testing.assert_close(p.grad, accumulated[n], atol=1e-6, rtol=1e-4)


def test_max_epochs_and_time_budget_stop_training(tmp_path: Path) -> None:
    data = copy_pairs(20)
    result = trainer(tmp_path / "e", data=data, max_steps=1000, max_epochs=2).fit()
    assert result.progress.epoch == 2 and "2 epochs" in result.progress.stop_reason
    assert checkpoint.list_checkpoints(tmp_path / "e")  # ends with a checkpoint
    result = trainer(tmp_path / "t", data=data, max_steps=100000, max_minutes=0.002).fit()
    assert "time budget" in result.progress.stop_reason
    assert result.progress.seconds >= 0.12 and result.progress.step < 100000


def test_cooldown_scales_the_rate_down_over_the_last_updates_or_minutes(tmp_path: Path) -> None:
    data = copy_pairs(20)
    t = trainer(tmp_path / "c", data=data, max_steps=10, warmup=1, cooldown=0.5)
    t.fit()
    paper = [16**-0.5 * s**-0.5 for s in range(1, 11)]  # d_model 16, warm-up 1
    # update s has spent (s - 1) / 10 of the budget: full rate up to update 6, then 0.8 ... 0.2
    factors = [1.0] * 6 + [0.8, 0.6, 0.4, 0.2]
    expected = [p * f for p, f in zip(paper, factors)]
    assert [t.learning_rate(s) for s in range(1, 11)] == pytest.approx(expected)
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(paper[-1] * 0.2)  # what the last update used
    # a time budget: three quarters of 10 minutes spent leaves half the rate
    timed = trainer(tmp_path / "m", data=data, max_steps=1000, max_minutes=10, warmup=1, cooldown=0.5)
    timed.state.seconds = 450.0
    assert timed.learning_rate(2) == pytest.approx(16**-0.5 * 2**-0.5 * 0.5)
    assert trainer(tmp_path / "p", data=data, max_steps=10, warmup=1).learning_rate(10) == \
        pytest.approx(paper[-1])


def test_early_stopping_on_the_task_metric(tmp_path: Path) -> None:
    data = copy_pairs(20)
    t = trainer(tmp_path, data=data, max_steps=1000, eval_every=2, patience=3)
    values = iter([0.5, 0.6, 0.6, 0.55, 0.59, 0.9])
    t.validate = lambda model: {"acc": next(values)}
    t.metric = "acc"
    result = t.fit()
    assert result.progress.step == 10  # validations at 2, 4 (best), 6, 8, 10: three without gain
    assert [v["dev_acc"] for v in result.validations] == [0.5, 0.6, 0.6, 0.55, 0.59]
    assert "no better dev acc" in result.progress.stop_reason


def test_early_stopping_on_an_error_rate(tmp_path: Path) -> None:
    data = copy_pairs(20)
    t = trainer(tmp_path, data=data, max_steps=1000, eval_every=2, patience=2)
    values = iter([40.0, 30.0, 35.0, 31.0, 10.0])
    t.validate = lambda model: {"wer": next(values)}
    t.metric, t.metric_mode = "wer", "min"
    result = t.fit()
    assert [v["dev_wer"] for v in result.validations] == [40.0, 30.0, 35.0, 31.0]  # 30 the best
    assert result.progress.best_metric == 30.0 and "no better dev wer in 2" in result.progress.stop_reason


@pytest.mark.parametrize("mode, best_step", [("min", 4), ("max", 2)])
def test_the_best_checkpoint_follows_the_direction_of_the_metric(tmp_path: Path, mode: str, best_step: int,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    t = trainer(tmp_path, data=copy_pairs(20), max_steps=8, eval_every=2, checkpoint_every=2)
    values = iter([40.0, 30.0, 35.0, 31.0])  # validations at updates 2, 4, 6, 8
    t.validate = lambda model: {"wer": next(values)}
    t.metric, t.metric_mode = "wer", mode
    with caplog.at_level(logging.INFO, logger="seqtrans.training.loop"):
        t.fit()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("new best")]
    news = ["dev_wer 40 at step 2", "dev_wer 30 at step 4"] if mode == "min" else ["dev_wer 40 at step 2"]
    assert said == [f"new best checkpoint: {n} ({tmp_path / checkpoint.BEST})" for n in news]
    best = checkpoint.load(tmp_path / checkpoint.BEST)
    assert (best["step"], best["best_metric"]) == (best_step, 30.0 if mode == "min" else 40.0)
    same = checkpoint.load(tmp_path / checkpoint.checkpoint_name(best_step))["model"]
    last = checkpoint.load(tmp_path / checkpoint.checkpoint_name(8))["model"]
    assert all(torch.equal(best["model"][name], same[name]) for name in same)
    assert not all(torch.equal(best["model"][name], last[name]) for name in last)
    assert checkpoint.list_checkpoints(tmp_path)[-1].name == checkpoint.checkpoint_name(8)  # not a step


def test_bf16_precision_trains_under_autocast_with_fp32_weights(tmp_path: Path) -> None:
    data = copy_pairs(8)
    losses: dict[str, float] = {}
    for precision in ("fp32", "bf16"):
        t = trainer(tmp_path / precision, data=data, max_steps=1, precision=precision)
        t.model.eval()  # no dropout, so both see the same function
        t.model.train = lambda mode=True, m=t.model: m  # type: ignore[method-assign]
        total, _, tokens = t._update([np.arange(8)])
        losses[precision] = total / tokens
        assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
                   for p in t.model.parameters())
    assert losses["fp32"] != losses["bf16"]  # autocast was on
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)


def test_precision_auto_is_fp32_on_cpu_and_fp16_needs_cuda(tmp_path: Path) -> None:
    data = copy_pairs(8)
    assert trainer(tmp_path / "a", data=data, precision="auto").precision == "fp32"
    with pytest.raises(TrainingError, match="fp16 needs a CUDA device"):
        trainer(tmp_path / "h", data=data, precision="fp16")


def test_the_last_epoch_trains_on_its_remainder_and_covers_every_batch(tmp_path: Path) -> None:
    data = copy_pairs(40)
    t = trainer(tmp_path, data=data, max_steps=1000, max_epochs=1, accumulate=3)
    batches = len(t._epoch_batches(1))
    assert batches % 3  # a remainder that does not fill an update
    result = t.fit()
    assert result.progress.step == -(-batches // 3)
    assert result.progress.target_tokens == sum(len(s) + 1 for s in data.tgt)
