"""One update of the model: the forward and backward passes of an update's batches under
the run's precision (autocast, and fp16's loss scale), their gradients accumulated,
clipped, and applied at the schedule's rate; and the policy for an update that cannot
be taken: a loss or gradient that is not finite, an fp16 overflow, a batch out of GPU
memory. Such an update is skipped and counted; ``train.max_skipped`` in a row stop the
run with an error naming the batch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from seqtrans.attention import LatencyReporting, waiting
from seqtrans.config import TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.data.vocab import PAD
from seqtrans.errors import TrainingError
from seqtrans.linear.precision import autocast
from seqtrans.model.transformer import Transformer
from seqtrans.training import distributed
from seqtrans.training.distributed import World
from seqtrans.training.loss import latency_losses, projected_label_smoothed_loss
from seqtrans.training.progress import Progress
from seqtrans.training.runlog import log
from seqtrans.training.schedule import Schedule

#: Below this fp16 loss scale the run stops: the loss overflows even when barely scaled.
MIN_LOSS_SCALE = 1e-4

#: A batch out of GPU memory is tried again cut in this many parts, then skipped.
SPLITS = (1, 2, 4, 8)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on a GPU with bf16 arithmetic, fp32 elsewhere."""
    if precision != "auto":
        return precision
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def training_lag(model: Transformer, mask: Tensor) -> int | None:
    """Multi-k training's wait-k lag of a batch (``model.multi_k``, Elbayad et al. 2020),
    drawn from 1 to its longest source with the global generator, so that a seed repeats
    it; None otherwise.  mask [B, S], True at real tokens"""
    if not (model.training and model.config.multi_k):
        return None
    return int(torch.randint(1, int(mask.sum(1).max()) + 1, ()))


def batch_hidden(model: Transformer, src: Tensor, tgt_in: Tensor) -> Tensor:
    """The decoder's last hidden states of a training batch, teacher-forced, under the
    batch's multi-k lag (:func:`training_lag`, drawn between the encoder's dropout and the
    decoder's, so that a seed draws the lags and masks it always drew).
    src [B, S], tgt_in [B, T] -> [B, T, D]"""
    encoded = model.encode(src)
    with waiting(training_lag(model, encoded.mask)):
        return model.decode_hidden(tgt_in, encoded)


def expected_delays(model: Transformer) -> list[Tensor]:
    """The expected delays of each decoder layer whose encoder-decoder attention has a
    read policy, from the last training forward pass; taken once: [B, T] for one
    monotonic head per layer (MILk), [B, H, T] for one per head (MMA)."""
    delays = []
    for layer in model.decoder_layers:
        if isinstance(layer.cross_attn, LatencyReporting):
            taken = layer.cross_attn.take_delays()
            if taken is not None:
                delays.append(taken)
    return delays

class LossModule(torch.nn.Module):
    """The model with its loss as ``forward``, the unit that data parallelism wraps
    (so that its gradient hooks see every parameter the loss uses)."""

    def __init__(self, model: Transformer, smoothing: float, precision: str, *,
                 latency_weight: float = 0.0, latency_weight_var: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.smoothing = smoothing
        self.precision = precision
        self.latency_weight = latency_weight
        self.latency_weight_var = latency_weight_var

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of a batch; with a read policy and
        ``train.latency_weight`` (``train.latency_weight_var``), the loss includes the
        weighted latency (the variance of its heads' delays) of each sentence."""
        with autocast(src.device, self.precision):
            hidden = batch_hidden(self.model, src, tgt_in)  # [B, T, D]
            loss, nll = projected_label_smoothed_loss(hidden, self.model.output_weight, tgt_out,
                                                      bias=self.model.output_bias, smoothing=self.smoothing)
        delays = expected_delays(self.model)
        if delays and (self.latency_weight or self.latency_weight_var):
            words = src.ne(PAD).sum(1) - 1  # source tokens without the end symbol
            average, variance = latency_losses([d.float() for d in delays], tgt_out.ne(PAD), words)
            loss = loss + self.latency_weight * average.sum() + self.latency_weight_var * variance.sum()
        return loss, nll


class UpdateStep:
    """Takes one update on ``net`` (the :class:`LossModule`, data-parallel or not) of
    ``model``'s parameters, advancing ``progress.step`` unless it is skipped."""

    def __init__(self, *, net: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, schedule: Schedule, train: TrainConfig, world: World,
                 device: torch.device) -> None:
        self.net = net
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.schedule = schedule
        self.train = train
        self.world = world
        self.device = device

    def __call__(self, group: list[np.ndarray], *, pairs: Pairs, tokens: int,
                 progress: Progress) -> tuple[float, int]:
        """One optimizer step on an update's global batches ``group`` (of ``tokens`` target
        tokens), of which this rank computes its dealt share; the loss is averaged over
        all their tokens, on every rank. On one process, a batch that does not fit in GPU
        memory is retried split in 2, 4 and 8 parts (the same update), then skipped.
        -> (this rank's summed loss, its target tokens)"""
        for parts in SPLITS:
            try:
                total, mine = self.gradients(group, pairs=pairs, tokens=tokens, parts=parts)
                break
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)  # a backward pass may have stopped halfway
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                update = progress.step + 1
                if self.world.distributed:  # the other ranks are already in the all-reduce
                    raise TrainingError(f"update {update}: rank {self.world.rank} ran out of GPU memory; "
                                        "lower train.max_tokens (and raise train.accumulate)") from None
                log.warning("update %d: out of GPU memory with its batches in %d part(s)%s", update, parts,
                            "; retrying with smaller parts" if parts < SPLITS[-1] else "")
        else:
            skip(progress, "batch does not fit in GPU memory even split in 8", group=group,
                 kept=pairs.kept, max_skipped=self.train.max_skipped)
            return 0.0, 0
        self.apply(group, total=total, kept=pairs.kept, progress=progress)
        return total, mine

    def gradients(self, group: list[np.ndarray], *, pairs: Pairs, tokens: int,
                  parts: int) -> tuple[float, int]:
        """Accumulate this rank's gradients of an update, its batches cut in ``parts``.
        -> (summed loss, target tokens)"""
        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro: list[tuple[np.ndarray, int]] = []
        for indices in distributed.deal(group, self.world, self.train.accumulate):
            # data parallelism averages gradients over ranks; weighting by the rank count
            # makes that average the sum over all the update's tokens, divided by them
            if indices is None:  # no batch left for this rank: a zero-weight step keeps it in step
                micro.append((group[0], 0))
            else:
                micro += [(part, self.world.size) for part in np.array_split(indices, parts) if len(part)]
        total, mine = 0.0, 0
        for i, (indices, weight) in enumerate(micro):
            batch = pairs.batch(indices).to(self.device)
            last = i == len(micro) - 1
            # gradients are all-reduced once, in the last backward pass of the update
            sync = nullcontext() if last or not isinstance(self.net, DistributedDataParallel) \
                else self.net.no_sync()
            with sync:
                loss, _ = self.net(batch.src, batch.tgt_in, batch.tgt_out)
                self.scaler.scale(loss * weight / tokens).backward()
            if weight:
                total += float(loss.detach())
                mine += batch.target_tokens
        return total, mine

    def apply(self, group: list[np.ndarray], *, total: float, kept: Sequence[int] | np.ndarray,
              progress: Progress) -> None:
        """The optimizer step on the accumulated gradients (clipped to ``train.clip_norm``),
        at the schedule's rate, unless they are not finite or fp16 overflowed."""
        if self.train.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.clip_norm)
        elif not self.scaler.is_enabled():  # fp16 finds non-finite gradients itself
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()
                                                  if p.grad is not None])
        if not self.scaler.is_enabled() and not math.isfinite(float(norm)):
            # gradients are all-reduced, so every rank takes the same decision
            self.optimizer.zero_grad(set_to_none=True)
            what = "loss is" if not math.isfinite(total) else "gradient norm is"
            skip(progress, f"{what} not finite", group=group, kept=kept, max_skipped=self.train.max_skipped)
            return
        progress.skipped_in_row = 0
        lr = self.schedule.rate(progress.step + 1, seconds=progress.seconds)
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        if self.scaler.is_enabled():
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < before:  # overflow: the step was skipped
                overflowed(progress, before, self.scaler.get_scale())
                return
        else:
            self.optimizer.step()
        progress.step += 1


def skip(progress: Progress, why: str, *, group: list[np.ndarray], kept: Sequence[int] | np.ndarray,
         max_skipped: int) -> None:
    """Count the next update as skipped because its ``why``; the ``max_skipped``-th in a
    row raises a TrainingError naming the update, its epoch and where its first examples
    are in the training data (``kept``: their positions there, empty when untracked)."""
    progress.skipped_updates += 1
    progress.skipped_in_row += 1
    update = progress.step + 1
    log.warning("update %d skipped: its %s (%d in a row)", update, why, progress.skipped_in_row)
    if progress.skipped_in_row >= max_skipped:
        examples = np.concatenate(group)
        positions = [int(kept[i]) if len(kept) else int(i) for i in examples[:5]]
        raise TrainingError(
            f"update {update}: {progress.skipped_in_row} updates in a row were skipped "
            f"(train.max_skipped), the last because its {why}; its batch, epoch {progress.epoch}, "
            f"held {len(examples)} training examples, the first at positions {positions} of the "
            "training data. Lower the learning rate, set train.clip_norm, lower train.max_tokens, "
            "or check those examples")


def overflowed(progress: Progress, scale: float, new: float) -> None:
    """Count an update fp16 skipped because its gradients overflowed at loss ``scale``
    (lowered to ``new``); below :data:`MIN_LOSS_SCALE` a TrainingError ends the run."""
    progress.skipped_updates += 1
    log.warning("update %d skipped: fp16 gradients overflowed at loss scale %g (now %g)",
                progress.step + 1, scale, new)
    if new < MIN_LOSS_SCALE:
        raise TrainingError(
            f"update {progress.step + 1}: the fp16 loss scale fell to {new:g} after "
            f"{progress.skipped_updates} skipped updates; the loss overflows even unscaled. "
            "Train with train.precision=bf16 or fp32, or lower the learning rate")
