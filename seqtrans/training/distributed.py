"""Data-parallel training on ``torch.distributed``: starting the ranks, the process group,
how batches are dealt to ranks, and the few collectives the pipeline needs.

Processes are started by ``torchrun`` (or ``seqtrans run --nproc N``, which calls it
through :func:`launch`):
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
import signal
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from seqtrans.errors import Interrupted, SeqtransError, UsageError
from seqtrans.runtime import environment
from seqtrans.training.world import SINGLE, World, world_from_env

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


# ----------------------------------------------------------------------------- starting the ranks


def launch(nproc: int, argv: list[str]) -> int:
    """``seqtrans ARGV`` in ``nproc`` processes under torchrun's agent, which ends them
    all when one fails; the failure is reported by rank."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    launcher = get_args_parser().parse_args(
        ["--standalone", f"--nproc_per_node={nproc}", "--shutdown-timeout=30", "--module", "seqtrans"])
    launcher.training_script_args = argv  # as given: torchrun's parser would read them as its own
    # the ranks run 'python -m seqtrans', which would put the working directory first on
    # sys.path (a seqtrans.py there would run instead); Python 3.11 leaves it out with this
    with environment.setting("PYTHONSAFEPATH", "1"):
        try:
            torchrun(launcher)
        except SignalException as exc:  # passed on to the ranks, which checkpoint and stop
            name = signal.Signals(exc.sigval).name
            raise Interrupted(f"stopped by {name}: each rank finished its update and rank 0 wrote a "
                              "checkpoint of it (see above); run the same command again to resume",
                              exc.sigval) from None
        except ChildFailedError as exc:
            rank, failure = exc.get_first_failure()
            how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
                   else f"exited with status {failure.exitcode}")
            raise SeqtransError(f"rank {rank} of {nproc} (pid {failure.pid}) {how}; the other ranks were "
                                "stopped (the failing rank's message, if it left one, is above)") from None
    return 0


#: What a collective's error says when another rank is gone or late (torch gives no one type).
LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out", "NCCL",
                "gloo")


def lost_contact(exc: RuntimeError, *, timeout: float) -> SeqtransError | None:
    """The error to report when ``exc`` says a collective failed because another rank is
    gone or did not answer within ``timeout`` seconds (``train.dist_timeout``); None when
    it says something else."""
    if not (isinstance(exc, dist.DistError) or any(marker in str(exc) for marker in LOST_MARKERS)):
        return None
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return SeqtransError(f"lost contact with the other ranks ({first}): one failed, or did not answer "
                         f"within train.dist_timeout ({timeout:g} s); its message, if it left one, says why")
