"""When training stops: the budget of updates and minutes (on a clock that leaves
validation out), early stopping on the task's validation metric, and SIGTERM or SIGINT
(stop after the current update with a checkpoint; a second signal stops at once)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from seqtrans.errors import Interrupted
from seqtrans.training.progress import Progress, pausing
from seqtrans.training.runlog import log


def budget_spent(progress: Progress, *, max_steps: int, max_minutes: float) -> str:
    """Why the budget of updates or minutes (0: none) is spent, or "" while it is not."""
    if progress.step >= max_steps:
        return f"reached {max_steps} updates"
    if max_minutes and progress.seconds >= max_minutes * 60:
        return f"reached the time budget of {max_minutes:g} minutes"
    return ""


def observe(progress: Progress, record: Mapping[str, float], metric: str | None, *,
            mode: str = "max") -> bool:
    """Count a validation as the best so far (``mode`` "max": higher is better; "min":
    lower is, an error rate) or as one without gain; a record without ``dev_METRIC``
    counts as neither. True when it is the best so far."""
    key = f"dev_{metric}"
    if not metric or key not in record:
        return False
    value = record[key]
    best = progress.best_metric
    if best is None or (value > best if mode == "max" else value < best):
        progress.best_metric, progress.best_step = value, progress.step
        progress.bad_validations = 0
        return True
    progress.bad_validations += 1
    return False


def patience_spent(progress: Progress, *, patience: int, metric: str | None) -> str:
    """Why training stops early (``patience`` validations in a row without gain; 0 never),
    or ""."""
    if patience and progress.bad_validations >= patience:
        return f"no better dev {metric} in {patience} validations"
    return ""


class Stopwatch:
    """Seconds of training: ``start`` seconds before, plus the time since, less the time
    spent inside :meth:`paused`."""

    def __init__(self, start: float = 0.0) -> None:
        self._before = start
        self._started = time.perf_counter()

    def seconds(self) -> float:
        return self._before + time.perf_counter() - self._started

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Time spent inside does not count."""
        return pausing(self._skip)

    def _skip(self, seconds: float) -> None:
        self._started += seconds



class Signals:
    """SIGTERM and SIGINT while :meth:`watching`: the first is noted in :attr:`received`
    for the loop to stop at the end of its update; a second ends the process at once,
    with the signal's own default action. Off the main thread nothing is installed
    (Python handles signals there only)."""

    def __init__(self) -> None:
        self.received = 0

    @contextlib.contextmanager
    def watching(self) -> Iterator[Signals]:
        self.received = 0
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received:  # the second: at once, with the signal's own default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        log.warning("%s received: stopping after this update with a checkpoint "
                    "(send it again to stop at once)", signal.Signals(signum).name)


def interrupted(signum: int, step: int, path: Path) -> Interrupted:
    """Log that a signal stopped training at ``step`` with the checkpoint ``path``, and
    return the error that ends the run (its exit status follows the signal)."""
    name = signal.Signals(signum).name
    log.warning("%s: stopped at update %d; checkpoint %s written", name, step, path)
    return Interrupted(f"stopped by {name} at update {step}; the checkpoint {path} holds it: "
                       "run the same command again to resume", signum)
