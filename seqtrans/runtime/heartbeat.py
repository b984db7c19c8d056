"""Long work that shows it is alive: a progress bar where one is shown (a terminal), and
otherwise a log line at least every :data:`EVERY_S` seconds, so that a log file written
while standard error is not a terminal shows how far the work has come."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tqdm import tqdm

#: The most seconds between two lines of work whose bar is not shown.
EVERY_S = 30.0


class Heartbeat:
    """Whether a line is due: true once at least ``every`` seconds have passed since the
    last one (or since this was made); :meth:`reset` when a line is written otherwise."""

    def __init__(self, every: float = EVERY_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._last = clock()

    def due(self) -> bool:
        if self._clock() - self._last < self.every:
            return False
        self.reset()
        return True

    def reset(self) -> None:
        self._last = self._clock()


class Counter:
    """Counts ``total`` items of work named ``desc``: on a tqdm bar with ``progress``,
    else on a log line of ``logger`` whenever the :class:`Heartbeat` is due."""

    def __init__(self, *, total: int, desc: str, unit: str, progress: bool, logger: logging.Logger,
                 heartbeat: Heartbeat | None = None) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self._log = logger
        self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False) if progress else None
        self._heartbeat = None if progress else heartbeat or Heartbeat()

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._heartbeat is not None and self.done < self.total and self._heartbeat.due():
            self._log.info("%s: %d of %d %s", self.desc, self.done, self.total, self.unit)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
