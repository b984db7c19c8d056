"""Where this process stands among the processes of a job, as torchrun describes it in
the environment; imports no torch, so that commands which need no model can read it."""

from __future__ import annotations

from dataclasses import dataclass

from seqtrans.errors import UsageError
from seqtrans.runtime import environment


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


SINGLE = World()


def world_from_env() -> World:
    """The world torchrun describes in the environment; one process when it describes none."""
    try:
        size, rank, local = environment.torchrun_world()
    except ValueError as exc:
        raise UsageError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers: {exc}") from None
    if size < 1 or not 0 <= rank < size:
        raise UsageError(f"RANK {rank} is not a rank of WORLD_SIZE {size}")
    return World(rank, size, local)
