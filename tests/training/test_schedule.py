"""The learning rate of section 5.3 at hand-computed points."""

from __future__ import annotations

import pytest

from seqtrans.training.schedule import Schedule, cooldown_factor, inverse_sqrt_lr


def test_learning_rate_at_steps_1_4000_and_16000() -> None:
    lr = lambda step: inverse_sqrt_lr(step, d_model=512, warmup=4000)  # noqa: E731
    # 512^-0.5 * 1 * 4000^-1.5 = 0.0441942 * 3.95285e-6
    assert lr(1) == pytest.approx(1.746928e-07, rel=1e-6)
    # the peak: 512^-0.5 * 4000^-0.5
    assert lr(4000) == pytest.approx(6.987712e-04, rel=1e-6)
    # decay: 512^-0.5 * 16000^-0.5, half the peak
    assert lr(16000) == pytest.approx(3.493856e-04, rel=1e-6)
    assert lr(2000) == pytest.approx(lr(4000) / 2)  # linear warm-up


def test_scale_factor_multiplies_the_rate() -> None:
    assert inverse_sqrt_lr(100, d_model=256, warmup=50, scale=2.0) == pytest.approx(
        2 * 256**-0.5 * 100**-0.5)


def test_cooldown_falls_linearly_to_zero_over_the_end_of_the_budget() -> None:
    assert [cooldown_factor(u, 0.25) for u in (0.0, 0.5, 0.75, 0.8, 0.875, 1.0, 1.2)] == \
        pytest.approx([1.0, 1.0, 1.0, 0.8, 0.5, 0.0, 0.0])
    assert cooldown_factor(0.99, 0.0) == 1.0 and cooldown_factor(0.5, 1.0) == pytest.approx(0.5)


def test_a_runs_rate_cools_down_by_updates_or_by_minutes_whichever_is_spent_faster() -> None:
    schedule = Schedule(d_model=16, warmup=1, cooldown=0.5, max_steps=10, max_minutes=10.0)
    # 16^-0.5 * 5^-0.5 = 0.25 / sqrt(5); update 5 has spent 4/10 of the updates
    assert schedule.rate(5, seconds=0.0) == pytest.approx(0.25 / 5**0.5)
    # 8 of 10 minutes spent (80%) binds before 40% of the updates: (1 - 0.8) / 0.5 = 0.4
    assert schedule.rate(5, seconds=480.0) == pytest.approx(0.25 / 5**0.5 * 0.4)
    # update 9 has spent 8/10 of the updates, the clock less: 0.4 again
    assert schedule.rate(9, seconds=60.0) == pytest.approx(0.25 / 3 * 0.4)
    untimed = Schedule(d_model=16, warmup=1, cooldown=0.5, max_steps=10)
    assert untimed.rate(5, seconds=1e9) == pytest.approx(0.25 / 5**0.5)  # no time budget
    plain = Schedule(d_model=16, warmup=4, max_steps=10)
    assert [plain.rate(s, seconds=0.0) for s in (1, 4, 10)] == pytest.approx(
        [0.25 * 4**-1.5, 0.25 * 4**-0.5, 0.25 * 10**-0.5])
