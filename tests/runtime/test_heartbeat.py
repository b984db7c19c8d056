"""Long work without a bar shows it is alive: a log line whenever the heartbeat is due."""

from __future__ import annotations

import logging

import pytest

from seqtrans.runtime.heartbeat import Counter, Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_heartbeat_is_due_once_each_time_its_seconds_have_passed() -> None:
    clock = Clock()
    beat = Heartbeat(30, clock=clock)
    clock.now += 29.9
    assert not beat.due()
    clock.now += 0.1
    assert beat.due() and not beat.due()  # counted afresh from the line it allowed
    clock.now += 20
    beat.reset()  # a line written otherwise
    clock.now += 20
    assert not beat.due()


def test_a_counter_without_a_bar_logs_how_far_it_has_come(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    logger = logging.getLogger("seqtrans.test_heartbeat")
    counter = Counter(total=10, desc="decode", unit="sentences", progress=False, logger=logger,
                      heartbeat=Heartbeat(30, clock=clock))
    with caplog.at_level(logging.INFO, logger=logger.name):
        counter.update(3)
        clock.now += 31
        counter.update(4)
        clock.now += 31
        counter.update(3)  # done: the caller says so itself
        counter.close()
    assert [r.getMessage() for r in caplog.records] == ["decode: 7 of 10 sentences"]
