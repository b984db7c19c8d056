"""Where a training run stands (:class:`Progress`, saved in every checkpoint), what
training returns (:class:`TrainResult`), and how its clocks leave out a pause
(:func:`pausing`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    batch_in_epoch: int = 0  # batches of this epoch already used
    best_metric: float | None = None
    best_step: int = 0  # the update of best_metric's validation (0: none yet)
    bad_validations: int = 0
    target_tokens: int = 0
    seconds: float = 0.0  # training wall time, validation excluded (the slowest rank's)
    stop_reason: str = ""
    skipped_updates: int = 0  # fp16 overflow, a loss or gradient not finite, out of GPU memory
    skipped_in_row: int = 0


@dataclass
class TrainResult:
    progress: Progress
    losses: list[float] = field(default_factory=list)  # per update, this process only
    validations: list[dict[str, float]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        p = self.progress
        return p.target_tokens / p.seconds if p.seconds > 0 else 0.0


@contextlib.contextmanager
def pausing(skip: Callable[[float], None]) -> Iterator[None]:
    """Hand the seconds spent inside to ``skip``: how a clock leaves out a pause."""
    paused = time.perf_counter()
    try:
        yield
    finally:
        skip(time.perf_counter() - paused)
