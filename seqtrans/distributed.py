"""Data-parallel training on ``torch.distributed``: the process group, how batches are
dealt to ranks, and the few collectives the pipeline needs.

Processes are started by ``torchrun`` (or ``seqtrans run --nproc N``, which calls it):
each reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address from its
environment (``env://``). Without those variables everything here is a no-op for one
process, so the single-device code path is the same code.

The pipeline keeps to one rule that makes several ranks agree without extra
messages: whatever decides control flow (the batches of an epoch, when to stop, the
validation record) is either computed identically on every rank from the same inputs,
or computed on one rank and broadcast.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from seqtrans import environment
from seqtrans.errors import UsageError
from seqtrans.world import SINGLE, World, world_from_env

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["SINGLE", "World", "all_max", "all_sum", "barrier", "broadcast", "current", "deal",
           "device_of", "gather_all", "gather_in_order", "init", "shutdown", "spread",
           "world_from_env"]


def current() -> World:
    """The world of the initialized process group, or one process."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), environment.torchrun_world()[2])
    return SINGLE


def init(device: str = "auto", *, timeout: float = 1800.0) -> World:
    """Join the process group torchrun set up (NCCL when the ranks use CUDA, gloo on
    CPU) and pick this rank's device; returns the world. One process: nothing to join.

    A collective that waits more than ``timeout`` seconds for the other ranks fails
    (``train.dist_timeout``): a rank that died or hangs ends the others' wait with an
    error instead of a silent hang."""
    world = world_from_env()
    if not world.distributed or dist.is_initialized():
        return current() if world.distributed else world
    if not dist.is_available():  # pragma: no cover - torch builds without distributed
        raise UsageError("this torch build has no torch.distributed")
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if torch.cuda.device_count() <= world.local_rank:
            raise UsageError(f"rank {world.rank}: LOCAL_RANK {world.local_rank} has no CUDA device "
                             f"({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(seconds=timeout))
    log.info("rank %d of %d joined (%s)", world.rank, world.size, dist.get_backend())
    return world


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def device_of(name: str | torch.device, world: World) -> torch.device:
    """The device of this rank: with CUDA, the GPU of its local rank."""
    device = name if isinstance(name, torch.device) else torch.device(name)
    if device.type == "cuda" and device.index is None and world.distributed:
        return torch.device("cuda", world.local_rank)
    return device


# ---------------------------------------------------------------------- dealing batches


def deal(batches: Sequence[T], world: World, accumulate: int) -> list[T | None]:
    """This rank's share of one update's batches.

    ``batches`` are the update's global batches, in order (up to ``world.size *
    accumulate`` of them; fewer at the very end of training). Rank ``r`` gets batches
    ``r, r + size, r + 2 size, ...``, so that ``size`` ranks with ``accumulate`` batches
    each train on the same batches as one process accumulating ``size * accumulate``.
    Every rank gets exactly ``accumulate`` slots, ``None`` where the update has no batch
    left for it (the rank runs a zero-weight step so the collectives stay in step).
    -> [accumulate] of batch or None
    """
    mine: list[T | None] = list(batches[world.rank:: world.size])
    if len(mine) > accumulate:
        raise ValueError(f"{len(batches)} batches for {world.size} ranks of {accumulate}")
    return mine + [None] * (accumulate - len(mine))


# ---------------------------------------------------------------------- collectives


def _tensor_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sums over ranks, in float64."""
    return _all_reduce(values, "SUM")


def all_max(values: Sequence[float]) -> list[float]:
    """Element-wise maxima over ranks, in float64."""
    return _all_reduce(values, "MAX")


def _all_reduce(values: Sequence[float], op: str) -> list[float]:
    if not current().distributed:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=_tensor_device())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return [float(v) for v in t.cpu()]


def broadcast(obj: T, src: int = 0) -> T:
    """``obj`` of rank ``src``, on every rank (pickled)."""
    if not current().distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_tensor_device())
    return box[0]


def gather_all(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank."""
    world = current()
    if not world.distributed:
        return [obj]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if current().distributed:
        dist.barrier()


def spread(lengths: Sequence[int] | np.ndarray, world: World) -> np.ndarray:
    """The indices of the inputs this rank decodes: sorted by length and dealt in
    turn, so every rank gets a similar share of the work.  -> ascending indices"""
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return np.sort(order[world.rank:: world.size])


def gather_in_order(count: int, mine: np.ndarray, values: Sequence[T]) -> list[T]:
    """All ranks' ``values`` for the inputs of :func:`spread`, back in input order."""
    if not current().distributed:
        return list(values)
    out: list[Any] = [None] * count
    for indices, part in gather_all((mine.tolist(), list(values))):
        for i, v in zip(indices, part, strict=True):
            out[i] = v
    return out
