"""What the ranks of a data-parallel run keep in step beyond their gradients: the model
wrapped so that backward passes all-reduce them, the training clock and a stop signal
agreed after each update, and which rank writes the run's files (rank 0 alone).

On one process each of these is the identity, so a single-device run takes the same
code path (:mod:`seqtrans.training.distributed`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from seqtrans.training import distributed
from seqtrans.training.distributed import World


def data_parallel(module: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """``module`` wrapped in DistributedDataParallel in a process group, else itself."""
    if not world.distributed:
        return module
    # buffers are constants (positions, masks): nothing to broadcast each step
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                   forward_sync_buffers=False, gradient_as_bucket_view=True)


def agree(seconds: float, signum: int) -> tuple[float, int]:
    """The clock and signal every rank acts on after an update: the slowest rank's
    seconds (so all stop and cool down alike) and any signal one of them received."""
    seconds, signalled = distributed.all_max([seconds, signum])
    return seconds, int(signalled)


def main_only(path: str | Path | None, world: World) -> Path | None:
    """``path`` on rank 0 (the one that writes), None on the others."""
    return Path(path) if path and world.main else None
