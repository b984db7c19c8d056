"""How many threads a small decoding step computes with: the process's count or one,
whichever was measured faster for steps of its size, on this machine, now.

A step of a few hypotheses (a sentence's beam) is a few hundred small operators, and
each parallel one among them wakes the OpenMP team. With the passive wait policy (the
default, :func:`seqtrans.runtime.threads.set_wait_policy`) a woken thread can cost more than
splitting a small operator saves, and beside busy processes a parallel region waits for
whichever of its threads the scheduler has set aside. On a quiet 2-core virtual machine
one thread decoded beam 4, batch 1 a third faster than two in int8 and a tenth slower in
fp32 (benchmarks/README.md, "Small steps"): no fixed count is right everywhere. So, for steps
of at most :data:`SMALL_STEP_ROWS` hypotheses, the searches time steps of each size with
one thread and with the process's count in turn (:data:`TRIALS` each), keep the team with
the lower median, and time them again :data:`RETRY_S` seconds later, as the machine's
load changes. Every operator of a step computes each row the same way whatever the
team, so the choice changes the speed, never a result (tests/decoding/test_teams.py).

PyTorch's thread count is the process's, so a step changes it only while no other
thread is inside a step (a server's other decoding workers); ``SEQTRANS_STEP_TEAMS=0``
turns the choice off. Steps on another device than the CPU keep the process's count: their
operators run there, and a step's wall time there is mostly its launches.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from seqtrans.runtime import environment
from seqtrans.runtime.timing import TimedChoice

#: The most hypotheses of a step whose team is chosen; larger steps use every thread.
SMALL_STEP_ROWS = 16
#: Steps timed with each team before a choice.
TRIALS = 4
#: Seconds a choice holds before its teams are timed again.
RETRY_S = 30.0


class StepTeams:
    """The teams of a process's small decoding steps (see the module's notes)."""

    def __init__(self) -> None:
        # per model: a model's steps cost what its own precision and shape make them
        self._choices: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], TimedChoice[int]]] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._inside = 0  # threads inside a step now

    @contextlib.contextmanager
    def step(self, model: object, rows: int, device: torch.device) -> Iterator[None]:
        """A decoding step of ``model`` over ``rows`` hypotheses on ``device`` runs inside
        this, with its team."""
        threads = torch.get_num_threads()
        with self._lock:
            alone = self._inside == 0
            self._inside += 1
            choice = None
            if (alone and threads > 1 and rows <= SMALL_STEP_ROWS and device.type == "cpu"
                    and environment.step_teams()):
                choice = self._choice(model, rows, threads)
                team = choice.next() if choice is not None else threads
        try:
            if choice is None:
                yield
                return
            if team != threads:
                torch.set_num_threads(team)
            start = time.perf_counter()
            try:
                yield
            finally:
                if team != threads:
                    torch.set_num_threads(threads)
            elapsed = time.perf_counter() - start  # a step that raised is not timed
            with self._lock:
                choice.record(team, elapsed)
        finally:
            with self._lock:
                self._inside -= 1

    def _choice(self, model: object, rows: int, threads: int) -> TimedChoice[int] | None:
        try:
            own = self._choices.setdefault(model, {})
        except TypeError:  # a model that cannot be weakly referred to: no choice for it
            return None
        choice = own.get((rows, threads))
        if choice is None:  # not made afresh at every step
            choice = own[(rows, threads)] = TimedChoice((1, threads), trials=TRIALS, retry_s=RETRY_S)
        return choice

    def choices(self, model: object) -> dict[tuple[int, int], int]:
        """(rows, threads) -> the team chosen for ``model``'s steps of that size (sizes
        still timed left out)."""
        with self._lock:
            try:
                own = self._choices.get(model, {})
            except TypeError:
                return {}
            return {key: c.chosen for key, c in sorted(own.items()) if c.chosen is not None}


#: The process's teams, which every search's steps share.
TEAMS = StepTeams()


def step(model: object, rows: int, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """:meth:`StepTeams.step` of the process's teams."""
    return TEAMS.step(model, rows, device)
