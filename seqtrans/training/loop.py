"""The training loop: token-based batches, Adam with the paper's schedule, label
smoothing, validation with early stopping, a time budget and exact resumption."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from seqtrans.config import RunConfig, to_dict
from seqtrans.data import Batch, Pairs, lengths_of, token_batches
from seqtrans.errors import CheckpointError
from seqtrans.kernels import autocast
from seqtrans.model import Transformer
from seqtrans.training import checkpoint
from seqtrans.training.loss import projected_label_smoothed_loss
from seqtrans.training.schedule import cooldown_factor, inverse_sqrt_lr

log = logging.getLogger(__name__)

Validator = Callable[[Transformer], Mapping[str, float]]


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # batches of this epoch already used
    best_metric: float | None = None
    bad_validations: int = 0
    target_tokens: int = 0
    seconds: float = 0.0  # training wall time, validation excluded
    stop_reason: str = ""


@dataclass
class TrainResult:
    progress: Progress
    losses: list[float] = field(default_factory=list)  # per update, this process only
    validations: list[dict[str, float]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        p = self.progress
        return p.target_tokens / p.seconds if p.seconds > 0 else 0.0


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """Trains ``model`` on ``train`` and writes checkpoints to ``directory``.

    ``validate(model)`` returns the task's metrics on the dev set; the one named
    ``metric`` drives early stopping. ``assets`` (the task's vocabulary files) are
    stored in every checkpoint. ``resample(epoch)``, when given, returns the training
    sources (ids, ending with EOS) to use in that epoch, one per pair of ``train``; it
    must depend only on the epoch, so that a resumed run sees the same data.
    """

    def __init__(self, model: Transformer, config: RunConfig, train: Pairs, *,
                 directory: str | Path, device: torch.device, dev: Pairs | None = None,
                 validate: Validator | None = None, metric: str | None = None,
                 assets: Mapping[str, bytes] | None = None, progress_bar: bool = False,
                 log_file: str | Path | None = None,
                 resample: Callable[[int], list[list[int]]] | None = None) -> None:
        self.model = model.to(device)
        self.config = config
        self.c = config.train
        self.train_data = train
        self.dev = dev
        self.validate = validate
        self.metric = metric
        self.assets = dict(assets or {})
        self.device = device
        self.directory = Path(directory)
        self.progress_bar = progress_bar
        self.log_file = Path(log_file) if log_file else None
        self.resample = resample
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=self.c.adam_betas,
                                          eps=self.c.adam_eps)
        self.state = Progress()
        self._src_lengths = lengths_of(train.src)
        self._tgt_lengths = lengths_of(train.tgt)
        if not len(train):
            raise ValueError("no training examples")

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        payload = {
            "format": checkpoint.FORMAT,
            "config": to_dict(self.config),
            "assets": self.assets,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": asdict(self.state),
            "rng": _rng_state(),
        }
        path = self.directory / checkpoint.checkpoint_name(self.state.step)
        checkpoint.save_atomic(payload, path)
        checkpoint.prune(self.directory, self.c.keep_checkpoints)
        return path

    def resume(self) -> bool:
        """Continue from the newest checkpoint in the directory, if there is one."""
        found = checkpoint.list_checkpoints(self.directory)
        if not found:
            return False
        payload = checkpoint.load(found[-1])
        if "optimizer" not in payload:
            raise CheckpointError(f"{found[-1]}: holds no training state to resume from")
        saved_model = payload["config"].get("model")
        if saved_model != to_dict(self.config.model):
            raise CheckpointError(
                f"{found[-1]}: was written for another model configuration; use a new output directory"
            )
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.state = Progress(**payload["progress"])
        self.state.stop_reason = ""
        _set_rng_state(payload["rng"])
        log.info("resumed from %s at step %d", found[-1], self.state.step)
        return True

    # ------------------------------------------------------------------ data

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self.resample is not None:
            src = self.resample(epoch)
            if len(src) != len(self.train_data.src):
                raise ValueError(f"resample({epoch}) gave {len(src)} sources for "
                                 f"{len(self.train_data.src)} pairs")
            self.train_data = Pairs(src, self.train_data.tgt, self.train_data.kept)
            self._src_lengths = lengths_of(src)
        return token_batches(self._src_lengths, self._tgt_lengths, self.c.max_tokens,
                             seed=self.config.seed, epoch=epoch)

    def _updates(self) -> Iterator[list[Batch]]:
        """Groups of ``accumulate`` batches, from the saved data position on."""
        epoch_batches = self._epoch_batches(self.state.epoch)
        while True:
            group: list[Batch] = []
            while len(group) < self.c.accumulate:
                if self.state.batch_in_epoch >= len(epoch_batches):
                    if self.c.max_epochs and self.state.epoch >= self.c.max_epochs:
                        self.state.stop_reason = f"reached {self.c.max_epochs} epochs"
                        return
                    self.state.epoch += 1
                    self.state.batch_in_epoch = 0
                    epoch_batches = self._epoch_batches(self.state.epoch)
                group.append(self.train_data.batch(epoch_batches[self.state.batch_in_epoch]))
                self.state.batch_in_epoch += 1
            yield group

    # ------------------------------------------------------------------ steps

    def learning_rate(self, step: int) -> float:
        """The rate of update ``step`` (from 1); with ``train.cooldown``, scaled down over
        the end of the budget: updates (``max_steps``) or time (``max_minutes``), whichever
        is spent faster."""
        lr = inverse_sqrt_lr(step, d_model=self.config.model.d_model, warmup=self.c.warmup,
                             scale=self.c.lr_scale)
        if self.c.cooldown:
            used = (step - 1) / self.c.max_steps
            if self.c.max_minutes:
                used = max(used, self.state.seconds / (self.c.max_minutes * 60))
            lr *= cooldown_factor(used, self.c.cooldown)
        return lr

    def _update(self, group: list[Batch]) -> tuple[float, int]:
        """One optimizer step on a group of batches; the loss is averaged over all
        their target tokens.  -> (loss per token, target tokens)"""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(b.target_tokens for b in group)
        total = 0.0
        for batch in group:
            batch = batch.to(self.device)
            loss, _ = self._loss(batch)
            (loss / tokens).backward()
            total += float(loss.detach())
        if self.c.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.clip_norm)
        lr = self.learning_rate(self.state.step + 1)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.optimizer.step()
        self.state.step += 1
        return total / tokens, tokens

    def _loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of a batch (on the device)."""
        with autocast(self.device, self.c.precision):
            hidden = self.model.hidden(batch.src, batch.tgt_in)  # [B, T, D]
            return projected_label_smoothed_loss(hidden, self.model.output_weight, batch.tgt_out,
                                                 smoothing=self.c.label_smoothing)

    @torch.inference_mode()
    def dev_loss(self) -> dict[str, float]:
        """Label-smoothed loss and perplexity per target token on the dev set."""
        assert self.dev is not None
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        for idx in token_batches(lengths_of(self.dev.src), lengths_of(self.dev.tgt),
                                 self.c.max_tokens, seed=0, epoch=0, shuffle=False):
            batch = self.dev.batch(idx).to(self.device)
            loss, nll = self._loss(batch)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.target_tokens
        return {"dev_loss": loss_sum / tokens, "dev_ppl": math.exp(min(nll_sum / tokens, 50.0))}

    def _validate(self) -> dict[str, float]:
        record: dict[str, float] = {"step": self.state.step}
        if self.dev is not None and len(self.dev):
            record.update(self.dev_loss())
        if self.validate is not None:
            record.update({f"dev_{k}": float(v) for k, v in self.validate(self.model).items()})
        key = f"dev_{self.metric}"
        if self.metric and key in record:
            value = record[key]
            if self.state.best_metric is None or value > self.state.best_metric:
                self.state.best_metric = value
                self.state.bad_validations = 0
            else:
                self.state.bad_validations += 1
        log.info("validation | %s", " | ".join(f"{k} {v:.4g}" for k, v in record.items()))
        self._write_log({"event": "validation", **record})
        return record

    def _write_log(self, record: Mapping[str, Any]) -> None:
        if self.log_file is not None:
            with self.log_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ loop

    def fit(self, *, resume: bool = True) -> TrainResult:
        """Train until a stopping condition; always ends with a checkpoint."""
        if resume:
            self.resume()
        c = self.c
        result = TrainResult(self.state)
        if self.state.step >= c.max_steps:
            self.state.stop_reason = f"reached {c.max_steps} updates"
            return result
        bar = tqdm(total=c.max_steps, initial=self.state.step, desc="train", unit="step",
                   disable=not self.progress_bar, dynamic_ncols=True)
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        last_saved = -1
        started = time.perf_counter()
        seconds_before = self.state.seconds
        for group in self._updates():
            loss, tokens = self._update(group)
            result.losses.append(loss)
            self.state.target_tokens += tokens
            self.state.seconds = seconds_before + time.perf_counter() - started
            window_loss += loss * tokens
            window_tokens += tokens
            step = self.state.step
            bar.update(1)
            if step % c.log_every == 0 or step == 1:
                elapsed = time.perf_counter() - window_start
                line = {"step": step, "epoch": self.state.epoch, "loss": window_loss / window_tokens,
                        "lr": self.learning_rate(step), "tokens_per_s": window_tokens / max(elapsed, 1e-9)}
                bar.set_postfix(loss=f"{line['loss']:.3f}", lr=f"{line['lr']:.2e}",
                                tok_s=f"{line['tokens_per_s']:.0f}")
                log.info("step %d | epoch %d | loss %.4f | lr %.3e | %.0f tok/s", step,
                         self.state.epoch, line["loss"], line["lr"], line["tokens_per_s"])
                self._write_log({"event": "train", **line})
                window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
            stop = self._stop_reason()
            if step % c.eval_every == 0 or stop:
                paused = time.perf_counter()
                result.validations.append(self._validate())
                started += time.perf_counter() - paused  # validation does not count as training time
                window_start += time.perf_counter() - paused
                if c.patience and self.state.bad_validations >= c.patience:
                    stop = stop or f"no better dev {self.metric} in {c.patience} validations"
            if step % c.checkpoint_every == 0 or stop:
                self.save()
                last_saved = step
            if stop:
                self.state.stop_reason = stop
                break
        bar.close()
        if not self.state.stop_reason:
            self.state.stop_reason = "data exhausted"
        if last_saved != self.state.step:  # ended by max_epochs
            result.validations.append(self._validate())
            self.save()
        log.info("training stopped at step %d: %s", self.state.step, self.state.stop_reason)
        return result

    def _stop_reason(self) -> str:
        c = self.c
        if self.state.step >= c.max_steps:
            return f"reached {c.max_steps} updates"
        if c.max_minutes and self.state.seconds >= c.max_minutes * 60:
            return f"reached the time budget of {c.max_minutes:g} minutes"
        return ""
