"""A choice between equivalent ways of doing one thing, made by timing them where they
are used: each way in turn until every way has been timed ``trials`` times, then the way
with the lowest median, for good or until ``retry_s`` seconds have passed (when they are
timed afresh, as a machine's load changes). Medians, because a call that another
process's burst of work delayed says little. Used for the int8 product of a decoding
layer (:mod:`seqtrans.linear.int8`) and a small step's thread count
(:mod:`seqtrans.decoding.teams`); the ways must give the same results.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Generic, TypeVar

Way = TypeVar("Way")


class TimedChoice(Generic[Way]):
    """Which of ``ways`` to use next (:meth:`next`), from the timings :meth:`record` is given."""

    def __init__(self, ways: Sequence[Way], *, trials: int, retry_s: float | None = None) -> None:
        self.ways = tuple(ways)
        self.trials = trials
        self.retry_s = retry_s
        self.seconds: dict[Way, list[float]] = {way: [] for way in self.ways}
        self.chosen: Way | None = None  # None while timing
        self._chosen_at = 0.0

    def next(self) -> Way:
        """The choice, or while timing the way with the fewest timings (the first of them)."""
        if (self.chosen is not None and self.retry_s is not None
                and time.monotonic() - self._chosen_at > self.retry_s):
            self.chosen = None
            self.seconds = {way: [] for way in self.ways}
        if self.chosen is not None:
            return self.chosen
        return min(self.ways, key=lambda way: len(self.seconds[way]))

    def record(self, way: Way, seconds: float) -> None:
        """A call of ``way`` took ``seconds`` (ignored once the choice is made)."""
        if self.chosen is not None:
            return
        self.seconds[way].append(seconds)
        if all(len(times) >= self.trials for times in self.seconds.values()):
            self.chosen = min(self.ways, key=lambda way: sorted(self.seconds[way])[self.trials // 2])
            self._chosen_at = time.monotonic()
