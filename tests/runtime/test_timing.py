"""A timed choice tries each way in turn and keeps the one with the lowest median."""

from __future__ import annotations

from seqtrans.runtime.timing import TimedChoice


def test_each_way_in_turn_then_the_lowest_median_not_the_lowest_time() -> None:
    choice = TimedChoice(("a", "b"), trials=3)
    times = {"a": [1.0, 1.0, 1.0], "b": [0.1, 2.0, 2.0]}  # b once faster, a faster as a rule
    order = []
    while choice.chosen is None:
        way = choice.next()
        order.append(way)
        choice.record(way, times[way][order.count(way) - 1])
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert choice.chosen == "a" and choice.next() == "a"
    choice.record("b", 0.0)  # after the choice, timings change nothing
    assert choice.next() == "a"


def test_a_choice_with_a_retry_is_timed_afresh_once_old() -> None:
    choice = TimedChoice((1, 2), trials=1, retry_s=0.0)
    choice.record(choice.next(), 2.0)
    choice.record(choice.next(), 1.0)
    assert choice.chosen == 2
    assert choice.next() == 1 and choice.chosen is None  # old at once: each timed again
