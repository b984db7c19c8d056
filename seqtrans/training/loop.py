"""The training loop: token-based batches, Adam with the paper's schedule, label
smoothing, validation with early stopping, a time budget and exact resumption; on one
process or data-parallel across several (:mod:`seqtrans.training.distributed`).

:class:`Trainer` builds the parts and :meth:`Trainer.fit` is the loop over them: the
data order (:mod:`~seqtrans.training.order`), the update step
(:mod:`~seqtrans.training.step`), the run log (:mod:`~seqtrans.training.runlog`),
stopping and signals (:mod:`~seqtrans.training.stopping`), checkpoints
(:mod:`~seqtrans.training.resumption`) and what the ranks agree on
(:mod:`~seqtrans.training.ranks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from seqtrans.config import RunConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import TrainingError
from seqtrans.model.transformer import Transformer
from seqtrans.training import checkpoint, distributed, ranks, stopping
from seqtrans.training.distributed import World
from seqtrans.training.order import EpochBatches, Resample, update_groups
from seqtrans.training.progress import Progress, TrainResult
from seqtrans.training.resumption import Checkpointer, seed_rank
from seqtrans.training.runlog import RunLog, log
from seqtrans.training.schedule import Schedule
from seqtrans.training.step import MIN_LOSS_SCALE, LossModule, UpdateStep, resolve_precision
from seqtrans.training.validation import dev_loss

__all__ = ["MIN_LOSS_SCALE", "LossModule", "Progress", "TrainResult", "Trainer", "Validator",
           "resolve_precision"]

Validator = Callable[[Transformer], Mapping[str, float]]


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
                 validate: Validator | None = None, metric: str | None = None, metric_mode: str = "max",
                 assets: Mapping[str, bytes] | None = None, progress_bar: bool = False,
                 log_file: str | Path | None = None, tensorboard: str | Path | None = None,
                 resample: Resample | None = None, world: World | None = None) -> None:
        self.world = world or distributed.current()
        self.model = model.to(device)
        self.config = config
        self.c = c = config.train
        self.dev = dev
        self.validate = validate
        self.metric = metric
        self.metric_mode = metric_mode  # "max": higher is better; "min": lower is
        self.device = device
        self.directory = Path(directory)
        self.assets = dict(assets or {})
        self.precision = resolve_precision(c.precision, device)
        if self.precision == "fp16" and device.type != "cuda":
            raise TrainingError("train.precision=fp16 needs a CUDA device; use fp32 or bf16 on CPU")
        self.loss_module = LossModule(self.model, c.label_smoothing, self.precision,
                                      latency_weight=c.latency_weight,
                                      latency_weight_var=c.latency_weight_var)
        self.net = ranks.data_parallel(self.loss_module, self.world, device)
        fused = device.type == "cuda"  # one kernel for all parameters instead of several per tensor
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=c.adam_betas,
                                          eps=c.adam_eps, fused=fused or None)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.state = Progress()
        if self.world.rank > 0:
            seed_rank(config.seed, self.world.rank, 0)
        self.epochs = EpochBatches(train, max_tokens=c.max_tokens, seed=config.seed, resample=resample)
        if not len(train):
            raise ValueError("no training examples")
        self.schedule = Schedule(d_model=config.model.d_model, warmup=c.warmup, scale=c.lr_scale,
                                 cooldown=c.cooldown, max_steps=c.max_steps, max_minutes=c.max_minutes)
        self.update_step = UpdateStep(net=self.net, model=self.model, optimizer=self.optimizer,
                                      scaler=self.scaler, schedule=self.schedule, train=c, world=self.world,
                                      device=device)
        self.checkpointer = Checkpointer(self.directory, config=config, assets=self.assets,
                                         model=self.model, optimizer=self.optimizer, scaler=self.scaler,
                                         world=self.world)
        self.runlog = RunLog(log_file=ranks.main_only(log_file, self.world),
                             tensorboard=ranks.main_only(tensorboard, self.world),
                             progress_bar=progress_bar and self.world.main, log_every=c.log_every,
                             max_steps=c.max_steps, max_minutes=c.max_minutes)
        self.signals = stopping.Signals()

    @property
    def train_data(self) -> Pairs:
        """The training pairs, with the sources of the latest epoch when resampled."""
        return self.epochs.pairs

    @property
    def resample(self) -> Resample | None:
        """The task's sources per epoch, if it resamples them."""
        return self.epochs.resample

    @resample.setter
    def resample(self, resample: Resample | None) -> None:
        self.epochs.resample = resample

    def learning_rate(self, step: int) -> float:
        """The rate of update ``step`` (from 1) at the training time spent so far."""
        return self.schedule.rate(step, seconds=self.state.seconds)

    def save(self) -> Path:
        """Rank 0 writes a checkpoint with every rank's random state; the others wait."""
        return self.checkpointer.save(self.state)

    def resume(self) -> bool:
        """Continue from the newest usable checkpoint in the directory, if there is one
        (:meth:`Checkpointer.resume`)."""
        progress = self.checkpointer.resume()
        if progress is None:
            return False
        self.state = progress
        return True

    def dev_loss(self) -> dict[str, float]:
        """Label-smoothed loss and perplexity per target token on the dev set."""
        assert self.dev is not None
        return dev_loss(self.loss_module, self.dev, max_tokens=self.c.max_tokens, world=self.world,
                        device=self.device)

    # The loop reaches data and updates through these two methods, so that a test can
    # watch or disturb them.
    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return self.epochs(epoch)

    def _updates(self) -> Iterator[list[np.ndarray]]:
        return update_groups(self._epoch_batches, self.state, per_update=self.world.size * self.c.accumulate,
                             max_epochs=self.c.max_epochs)

    def _update(self, group: list[np.ndarray]) -> tuple[float, int, int]:
        """One update -> (this rank's summed loss, its target tokens, the update's target tokens)."""
        tokens = sum(self.epochs.target_tokens(b) for b in group)
        loss, mine = self.update_step(group, pairs=self.epochs.pairs, tokens=tokens, progress=self.state)
        return loss, mine, tokens

    def _validate(self) -> dict[str, float]:
        record: dict[str, float] = {"step": self.state.step}
        if self.dev is not None and len(self.dev):
            record.update(self.dev_loss())
        if self.validate is not None:
            record.update({f"dev_{k}": float(v) for k, v in self.validate(self.model).items()})
        record = distributed.broadcast(record)  # early stopping decides alike on every rank
        best = stopping.observe(self.state, record, self.metric, mode=self.metric_mode)
        if best:
            self.checkpointer.save_best(self.state)
        self.runlog.validation(record, self.state.seconds)
        if best:
            log.info("new best checkpoint: dev_%s %.4g at step %d (%s)", self.metric, self.state.best_metric,
                     self.state.best_step, self.directory / checkpoint.BEST)
        return record

    def fit(self, *, resume: bool = True) -> TrainResult:
        """Train until a stopping condition; always ends with a checkpoint.

        SIGTERM or SIGINT (a scheduler's notice of preemption, or Ctrl-C) ends training
        after the current update with a checkpoint of it, raising :class:`Interrupted`;
        a second signal ends the process at once (the checkpoints already written are
        complete: they are replaced atomically)."""
        with self.signals.watching(), self.runlog.following():
            return self._fit(resume)

    def _fit(self, resume: bool) -> TrainResult:
        if resume:
            self.resume()
        c, state = self.c, self.state
        result = TrainResult(state)
        if state.step >= c.max_steps:
            state.stop_reason = f"reached {c.max_steps} updates"
            return result
        self.runlog.start(state)
        clock = stopping.Stopwatch(state.seconds)
        last_saved = -1
        for group in self._updates():
            before = state.step
            loss, mine, tokens = self._update(group)
            seconds, signalled = ranks.agree(clock.seconds(), self.signals.received)
            if signalled:
                self._interrupted(signalled)
            if state.step == before:  # skipped (fp16 overflow, or not finite)
                continue
            result.losses.append(loss / mine if mine else 0.0)
            state.target_tokens += tokens
            state.seconds = seconds
            self.runlog.update(state, loss=loss, tokens=tokens, lr=self.learning_rate(state.step))
            stop = stopping.budget_spent(state, max_steps=c.max_steps, max_minutes=c.max_minutes)
            if state.step % c.eval_every == 0 or stop:
                with clock.paused(), self.runlog.paused():  # validation is not training time
                    result.validations.append(self._validate())
                stop = stop or stopping.patience_spent(state, patience=c.patience, metric=self.metric)
            if state.step % c.checkpoint_every == 0 or stop:
                self.save()
                last_saved = state.step
            if stop:
                state.stop_reason = stop
                break
        self.runlog.close_bar()
        if not state.stop_reason:
            state.stop_reason = "data exhausted"
        if last_saved != state.step:  # ended by max_epochs
            result.validations.append(self._validate())
            self.save()
        log.info("training stopped at step %d: %s", state.step, state.stop_reason)
        return result

    def _interrupted(self, signum: int) -> NoReturn:
        self.runlog.close_bar()
        path = self.save()
        raise stopping.interrupted(signum, self.state.step, path)
