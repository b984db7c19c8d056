"""The training loop: token-based batches, Adam with the paper's schedule, label
smoothing, validation with early stopping, a time budget and exact resumption; on one
process or data-parallel across several (:mod:`seqtrans.distributed`).

Under data parallelism every rank builds the same global batches of an epoch from the
lengths of the whole training set; an update takes the next ``ranks * accumulate`` of
them and deals them out (:func:`seqtrans.distributed.deal`), so the data position,
the schedule and the checkpoints are the same whatever the number of ranks."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from seqtrans import distributed
from seqtrans.config import RunConfig, same_settings, to_dict
from seqtrans.data import Batch, Pairs, lengths_of, token_batches
from seqtrans.distributed import World
from seqtrans.errors import CheckpointError, Interrupted, TrainingError
from seqtrans.model import Transformer
from seqtrans.precision import autocast
from seqtrans.training import checkpoint
from seqtrans.training.loss import projected_label_smoothed_loss
from seqtrans.training.schedule import cooldown_factor, inverse_sqrt_lr
from seqtrans.training.tracking import UPDATE_LINE, TensorBoard, TrainingBar, console_above_bar

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
    seconds: float = 0.0  # training wall time, validation excluded (the slowest rank's)
    stop_reason: str = ""
    skipped_updates: int = 0  # fp16 overflow, a loss or gradient not finite, out of GPU memory
    skipped_in_row: int = 0


#: Below this fp16 loss scale the run stops: the loss overflows even when barely scaled.
MIN_LOSS_SCALE = 1e-4


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


def _seed_rank(seed: int, rank: int, step: int) -> None:
    """Dropout of rank > 0 draws from its own stream (rank 0 keeps the run's, so one
    process trains as it always did)."""
    mixed = (seed * 1_000_003 + rank * 10_007 + step) % 2**63
    torch.manual_seed(mixed)
    random.seed(mixed)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on a GPU with bf16 arithmetic, fp32 elsewhere."""
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


class LossModule(torch.nn.Module):
    """The model with its loss as ``forward``, the unit that data parallelism wraps
    (so that its gradient hooks see every parameter the loss uses)."""

    def __init__(self, model: Transformer, smoothing: float, precision: str) -> None:
        super().__init__()
        self.model = model
        self.smoothing = smoothing
        self.precision = precision

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of a batch."""
        with autocast(src.device, self.precision):
            hidden = self.model.hidden(src, tgt_in)  # [B, T, D]
            return projected_label_smoothed_loss(hidden, self.model.output_weight, tgt_out,
                                                 smoothing=self.smoothing)


class Trainer:
    """Trains ``model`` on ``train`` and writes checkpoints to ``directory``.

    ``validate(model)`` returns the task's metrics on the dev set; the one named
    ``metric`` drives early stopping. ``assets`` (the task's vocabulary files) are
    stored in every checkpoint. ``resample(epoch)``, when given, returns the training
    sources (ids, ending with EOS) to use in that epoch, one per pair of ``train``; it
    must depend only on the epoch, so that a resumed run sees the same data.

    In a process group (``world``, by default the current one) the model is wrapped in
    :class:`~torch.nn.parallel.DistributedDataParallel`; only rank 0 logs, shows
    progress and writes checkpoints.

    ``progress_bar`` shows a bar on standard error in place of the per-update log lines
    on the console (other handlers, such as the run's log file, still get them);
    ``tensorboard``, a directory, receives the log's scalars as TensorBoard event files
    (:mod:`seqtrans.training.tracking`).
    """

    def __init__(self, model: Transformer, config: RunConfig, train: Pairs, *,
                 directory: str | Path, device: torch.device, dev: Pairs | None = None,
                 validate: Validator | None = None, metric: str | None = None,
                 assets: Mapping[str, bytes] | None = None, progress_bar: bool = False,
                 log_file: str | Path | None = None, tensorboard: str | Path | None = None,
                 resample: Callable[[int], list[list[int]]] | None = None,
                 world: World | None = None) -> None:
        self.world = world or distributed.current()
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
        self.progress_bar = progress_bar and self.world.main
        self.log_file = Path(log_file) if log_file and self.world.main else None
        self.tensorboard_dir = Path(tensorboard) if tensorboard and self.world.main else None
        self._tensorboard: TensorBoard | None = None
        self.resample = resample
        self.precision = resolve_precision(self.c.precision, device)
        if self.precision == "fp16" and device.type != "cuda":
            raise TrainingError("train.precision=fp16 needs a CUDA device; use fp32 or bf16 on CPU")
        self.loss_module = LossModule(self.model, self.c.label_smoothing, self.precision)
        self.net: torch.nn.Module = self.loss_module
        if self.world.distributed:
            # buffers are constants (positions, masks): nothing to broadcast each step
            self.net = DistributedDataParallel(
                self.loss_module, device_ids=[device.index] if device.type == "cuda" else None,
                forward_sync_buffers=False, gradient_as_bucket_view=True)
        fused = device.type == "cuda"  # one kernel for all parameters instead of several per tensor
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=self.c.adam_betas,
                                          eps=self.c.adam_eps, fused=fused or None)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.state = Progress()
        if self.world.rank > 0:
            _seed_rank(config.seed, self.world.rank, 0)
        self._src_lengths = lengths_of(train.src)
        self._tgt_lengths = lengths_of(train.tgt)
        if not len(train):
            raise ValueError("no training examples")

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        """Rank 0 writes a checkpoint with every rank's random state; the others wait."""
        rngs = distributed.gather_all(_rng_state())
        path = self.directory / checkpoint.checkpoint_name(self.state.step)
        if self.world.main:
            payload = {
                "format": checkpoint.FORMAT,
                "config": to_dict(self.config),
                "assets": self.assets,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "progress": asdict(self.state),
                "rng": rngs[0],
                "rng_ranks": rngs,
            }
            if self.scaler.is_enabled():
                payload["scaler"] = self.scaler.state_dict()
            checkpoint.save_atomic(payload, path)
            checkpoint.prune(self.directory, self.c.keep_checkpoints)
        distributed.barrier()
        return path

    def resume(self) -> bool:
        """Continue from the newest usable checkpoint in the directory, if there is one;
        damaged ones are set aside and reported (:func:`checkpoint.load_newest`). It may
        have been written by another number of ranks: the data position is global, and a
        rank the checkpoint has no random state for seeds its own from the step."""
        chosen: str | None = None
        if self.world.main:  # one rank judges the files, so all resume from the same one
            checkpoint.remove_temporary(self.directory)
            newest = checkpoint.load_newest(self.directory)
            chosen = str(newest[0]) if newest else None
        chosen = distributed.broadcast(chosen)
        if chosen is None:
            return False
        path = Path(chosen)
        payload = newest[1] if self.world.main and newest else checkpoint.load(path)
        if "optimizer" not in payload:
            raise CheckpointError(f"{path}: holds no training state to resume from")
        saved = payload["config"]
        if saved.get("task") != self.config.task:
            raise CheckpointError(f"{path}: was written by a run of task '{saved.get('task')}', not "
                                  f"'{self.config.task}'; use a new output directory")
        if not same_settings(saved.get("model"), self.config.model):
            raise CheckpointError(
                f"{path}: was written for another model configuration; use a new output directory"
            )
        if payload.get("assets", {}) != self.assets:  # same shapes, other symbols: would train on nonsense
            raise CheckpointError(f"{path}: was written with another vocabulary; use a new output "
                                  "directory")
        try:
            self.model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: weights do not fit the model: {exc}") from None
        self.optimizer.load_state_dict(payload["optimizer"])
        if "scaler" in payload and self.scaler.is_enabled():
            self.scaler.load_state_dict(payload["scaler"])
        self.state = Progress(**payload["progress"])
        self.state.stop_reason = ""
        rngs = payload.get("rng_ranks") or [payload["rng"]]
        if self.world.rank < len(rngs):
            _set_rng_state(rngs[self.world.rank])
        else:
            _seed_rank(self.config.seed, self.world.rank, self.state.step)
        log.info("resumed from %s at step %d", path, self.state.step)
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

    def _updates(self) -> Iterator[list[np.ndarray]]:
        """The global batches of each update (``ranks * accumulate``, as index arrays),
        from the saved data position on. An update may span two epochs; at the end of
        the last epoch (``max_epochs``) it takes what is left."""
        per_update = self.world.size * self.c.accumulate
        epoch_batches = self._epoch_batches(self.state.epoch)
        while True:
            group: list[np.ndarray] = []
            while len(group) < per_update:
                if self.state.batch_in_epoch >= len(epoch_batches):
                    if self.c.max_epochs and self.state.epoch >= self.c.max_epochs:
                        self.state.stop_reason = f"reached {self.c.max_epochs} epochs"
                        if group:
                            yield group
                        return
                    self.state.epoch += 1
                    self.state.batch_in_epoch = 0
                    epoch_batches = self._epoch_batches(self.state.epoch)
                group.append(epoch_batches[self.state.batch_in_epoch])
                self.state.batch_in_epoch += 1
            yield group

    def _target_tokens(self, indices: np.ndarray) -> int:
        """Target tokens of a batch (EOS included), from the lengths alone."""
        return int(np.asarray(self._tgt_lengths)[indices].sum()) + len(indices)

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

    def _update(self, group: list[np.ndarray]) -> tuple[float, int, int]:
        """One optimizer step on an update's global batches, of which this rank computes
        its dealt share; the loss is averaged over all their target tokens, on every
        rank. On one process, a batch that does not fit in GPU memory is retried split
        in 2, 4 and 8 parts (the same update), then skipped.
        -> (this rank's summed loss, its target tokens, the update's target tokens)"""
        tokens = sum(self._target_tokens(b) for b in group)
        for parts in (1, 2, 4, 8):
            try:
                total, mine = self._gradients(group, tokens, parts)
                break
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)  # a backward pass may have stopped halfway
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                update = self.state.step + 1
                if self.world.distributed:  # the other ranks are already in the all-reduce
                    raise TrainingError(f"update {update}: rank {self.world.rank} ran out of GPU memory; "
                                        "lower train.max_tokens (and raise train.accumulate)") from None
                log.warning("update %d: out of GPU memory with its batches in %d part(s)%s", update, parts,
                            "; retrying with smaller parts" if parts < 8 else "")
        else:
            self._skipped(group, "batch does not fit in GPU memory even split in 8")
            return 0.0, 0, tokens
        return self._step(group, total, mine, tokens)

    def _gradients(self, group: list[np.ndarray], tokens: int, parts: int) -> tuple[float, int]:
        """Accumulate this rank's gradients of an update, its batches cut in ``parts``.
        -> (summed loss, target tokens)"""
        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro: list[tuple[np.ndarray, int]] = []
        for indices in distributed.deal(group, self.world, self.c.accumulate):
            # data parallelism averages gradients over ranks; weighting by the rank count
            # makes that average the sum over all the update's tokens, divided by them
            if indices is None:  # no batch left for this rank: a zero-weight step keeps it in step
                micro.append((group[0], 0))
            else:
                micro += [(part, self.world.size) for part in np.array_split(indices, parts) if len(part)]
        total, mine = 0.0, 0
        for i, (indices, weight) in enumerate(micro):
            batch = self.train_data.batch(indices).to(self.device)
            last = i == len(micro) - 1
            sync = nullcontext() if last or not isinstance(self.net, DistributedDataParallel) \
                else self.net.no_sync()
            with sync:
                loss, _ = self.net(batch.src, batch.tgt_in, batch.tgt_out)
                self.scaler.scale(loss * weight / tokens).backward()
            if weight:
                total += float(loss.detach())
                mine += batch.target_tokens
        return total, mine

    def _step(self, group: list[np.ndarray], total: float, mine: int, tokens: int) -> tuple[float, int, int]:
        """The optimizer step on the accumulated gradients, unless they are not finite."""
        if self.c.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.clip_norm)
        elif not self.scaler.is_enabled():  # fp16 finds non-finite gradients itself
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()
                                                  if p.grad is not None])
        if not self.scaler.is_enabled() and not math.isfinite(float(norm)):
            # gradients are all-reduced, so every rank takes the same decision
            self.optimizer.zero_grad(set_to_none=True)
            what = "loss is" if not math.isfinite(total) else "gradient norm is"
            self._skipped(group, f"{what} not finite")
            return total, mine, tokens
        self.state.skipped_in_row = 0
        lr = self.learning_rate(self.state.step + 1)
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        if self.scaler.is_enabled():
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < before:  # overflow: the step was skipped
                self._overflowed(before)
                return total, mine, tokens
        else:
            self.optimizer.step()
        self.state.step += 1
        return total, mine, tokens

    def _skipped(self, group: list[np.ndarray], why: str) -> None:
        self.state.skipped_updates += 1
        self.state.skipped_in_row += 1
        update = self.state.step + 1
        log.warning("update %d skipped: its %s (%d in a row)", update, why, self.state.skipped_in_row)
        if self.state.skipped_in_row >= self.c.max_skipped:
            kept = self.train_data.kept
            examples = np.concatenate(group)
            positions = [int(kept[i]) if len(kept) else int(i) for i in examples[:5]]
            raise TrainingError(
                f"update {update}: {self.state.skipped_in_row} updates in a row were skipped "
                f"(train.max_skipped), the last because its {why}; its batch, epoch {self.state.epoch}, "
                f"held {len(examples)} training examples, the first at positions {positions} of the "
                "training data. Lower the learning rate, set train.clip_norm, lower train.max_tokens, "
                "or check those examples")

    def _overflowed(self, scale: float) -> None:
        self.state.skipped_updates += 1
        new = self.scaler.get_scale()
        log.warning("update %d skipped: fp16 gradients overflowed at loss scale %g (now %g)",
                    self.state.step + 1, scale, new)
        if new < MIN_LOSS_SCALE:
            raise TrainingError(
                f"update {self.state.step + 1}: the fp16 loss scale fell to {new:g} after "
                f"{self.state.skipped_updates} skipped updates; the loss overflows even unscaled. "
                "Train with train.precision=bf16 or fp32, or lower the learning rate")

    def _loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of a batch (on the device)."""
        return self.loss_module(batch.src, batch.tgt_in, batch.tgt_out)

    @torch.inference_mode()
    def dev_loss(self) -> dict[str, float]:
        """Label-smoothed loss and perplexity per target token on the dev set (its
        batches dealt to ranks in turn and the sums added up)."""
        assert self.dev is not None
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        batches = token_batches(lengths_of(self.dev.src), lengths_of(self.dev.tgt),
                                self.c.max_tokens, seed=0, epoch=0, shuffle=False)
        for idx in batches[self.world.rank:: self.world.size]:
            batch = self.dev.batch(idx).to(self.device)
            loss, nll = self._loss(batch)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.target_tokens
        loss_sum, nll_sum, total = distributed.all_sum([loss_sum, nll_sum, tokens])
        return {"dev_loss": loss_sum / total, "dev_ppl": math.exp(min(nll_sum / total, 50.0))}

    def _validate(self) -> dict[str, float]:
        record: dict[str, float] = {"step": self.state.step}
        if self.dev is not None and len(self.dev):
            record.update(self.dev_loss())
        if self.validate is not None:
            record.update({f"dev_{k}": float(v) for k, v in self.validate(self.model).items()})
        record = distributed.broadcast(record)  # early stopping decides alike on every rank
        key = f"dev_{self.metric}"
        if self.metric and key in record:
            value = record[key]
            if self.state.best_metric is None or value > self.state.best_metric:
                self.state.best_metric = value
                self.state.bad_validations = 0
            else:
                self.state.bad_validations += 1
        log.info("validation | %s", " | ".join(f"{k} {v:.4g}" for k, v in record.items()))
        self._write_log({"event": "validation", **record, "seconds": round(self.state.seconds, 3)})
        return record

    def _write_log(self, record: Mapping[str, Any]) -> None:
        if self.log_file is not None:
            with self.log_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            if record["event"] == "train":
                self._tensorboard.train(record)
            elif record["event"] == "validation":
                self._tensorboard.validation(record)

    # ------------------------------------------------------------------ loop

    def fit(self, *, resume: bool = True) -> TrainResult:
        """Train until a stopping condition; always ends with a checkpoint.

        SIGTERM or SIGINT (a scheduler's notice of preemption, or Ctrl-C) ends training
        after the current update with a checkpoint of it, raising :class:`Interrupted`;
        a second signal ends the process at once (the checkpoints already written are
        complete: they are replaced atomically)."""
        with self._signals(), self._following():
            return self._fit(resume)

    @contextlib.contextmanager
    def _following(self) -> Iterator[None]:
        """TensorBoard's event files open, and the console written above the bar."""
        with contextlib.ExitStack() as stack:
            if self.tensorboard_dir is not None:
                self._tensorboard = TensorBoard(self.tensorboard_dir)
                stack.callback(self._close_tensorboard)
            if self.progress_bar:
                stack.enter_context(console_above_bar())
            yield

    def _close_tensorboard(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        self._signal = 0
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, frame: object) -> None:
            if self._signal:  # the second: at once, with the signal's own default action
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self._signal = signum
            log.warning("%s received: stopping after this update with a checkpoint "
                        "(send it again to stop at once)", signal.Signals(signum).name)

        previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _fit(self, resume: bool) -> TrainResult:
        if resume:
            self.resume()
        c = self.c
        result = TrainResult(self.state)
        if self.state.step >= c.max_steps:
            self.state.stop_reason = f"reached {c.max_steps} updates"
            return result
        bar = TrainingBar(max_steps=c.max_steps, max_minutes=c.max_minutes, step=self.state.step,
                          seconds=self.state.seconds) if self.progress_bar else None
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        last_saved = -1
        started = time.perf_counter()
        seconds_before = self.state.seconds
        for group in self._updates():
            before = self.state.step
            loss, mine, tokens = self._update(group)
            seconds = seconds_before + time.perf_counter() - started
            # ranks stop and cool down by the same clock, the slowest one's, and stop for a
            # signal any of them received
            seconds, signalled = distributed.all_max([seconds, self._signal])
            if signalled:
                self._interrupted(int(signalled), bar)
            if self.state.step == before:  # skipped (fp16 overflow, or not finite)
                continue
            result.losses.append(loss / mine if mine else 0.0)
            self.state.target_tokens += tokens
            self.state.seconds = seconds
            window_loss += loss
            window_tokens += tokens
            step = self.state.step
            if bar is not None:
                bar.advance(step, self.state.seconds)
            if step % c.log_every == 0 or step == 1:
                elapsed = time.perf_counter() - window_start
                (summed,) = distributed.all_sum([window_loss])
                line = {"step": step, "epoch": self.state.epoch, "loss": summed / window_tokens,
                        "lr": self.learning_rate(step), "tokens_per_s": window_tokens / max(elapsed, 1e-9)}
                if bar is not None:
                    bar.show(line)
                log.info("step %d | epoch %d | loss %.4f | lr %.3e | %.0f tok/s", step,
                         self.state.epoch, line["loss"], line["lr"], line["tokens_per_s"], extra=UPDATE_LINE)
                self._write_log({"event": "train", **line, "seconds": round(self.state.seconds, 3)})
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
        if bar is not None:
            bar.close()
        if not self.state.stop_reason:
            self.state.stop_reason = "data exhausted"
        if last_saved != self.state.step:  # ended by max_epochs
            result.validations.append(self._validate())
            self.save()
        log.info("training stopped at step %d: %s", self.state.step, self.state.stop_reason)
        return result

    def _interrupted(self, signum: int, bar: TrainingBar | None) -> None:
        if bar is not None:
            bar.close()
        path = self.save()
        name = signal.Signals(signum).name
        log.warning("%s: stopped at update %d; checkpoint %s written", name, self.state.step, path)
        raise Interrupted(f"stopped by {name} at update {self.state.step}; the checkpoint {path} holds it: "
                          "run the same command again to resume", signum)

    def _stop_reason(self) -> str:
        c = self.c
        if self.state.step >= c.max_steps:
            return f"reached {c.max_steps} updates"
        if c.max_minutes and self.state.seconds >= c.max_minutes * 60:
            return f"reached the time budget of {c.max_minutes:g} minutes"
        return ""
