"""When training stops: the budgets, early stopping on hand-written validation series,
the clock that leaves validation out, and the signal handlers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqtrans.errors import Interrupted
from seqtrans.training import stopping
from seqtrans.training.progress import Progress


def test_the_budget_of_updates_or_minutes() -> None:
    spent = stopping.budget_spent
    assert spent(Progress(step=9, seconds=59.0), max_steps=10, max_minutes=1.0) == ""
    assert spent(Progress(step=10), max_steps=10, max_minutes=1.0) == "reached 10 updates"
    assert spent(Progress(step=3, seconds=60.0), max_steps=10, max_minutes=1.0) == \
        "reached the time budget of 1 minutes"
    assert spent(Progress(step=3, seconds=1e9), max_steps=10, max_minutes=0.0) == ""  # no time budget


def run(values: list[float | None], patience: int,
        mode: str = "max") -> tuple[list[int], list[str], Progress]:
    """Observe a validation series; -> bad counts and stop reasons after each."""
    progress = Progress()
    bad, reasons = [], []
    for value in values:
        record = {"step": 1.0} if value is None else {"step": 1.0, "dev_acc": value}
        stopping.observe(progress, record, "acc", mode=mode)
        bad.append(progress.bad_validations)
        reasons.append(stopping.patience_spent(progress, patience=patience, metric="acc"))
    return bad, reasons, progress


def test_early_stopping_counts_validations_without_a_gain() -> None:
    bad, reasons, progress = run([0.5, 0.6, 0.6, 0.55, 0.7, 0.65, 0.69, 0.7], patience=3)
    assert bad == [0, 0, 1, 2, 0, 1, 2, 3]  # equal is no gain; a new best resets the count
    assert progress.best_metric == 0.7
    assert reasons[:7] == [""] * 7 and reasons[7] == "no better dev acc in 3 validations"


def test_an_error_rate_improves_downwards() -> None:
    bad, reasons, progress = run([30.0, 25.0, 25.0, 26.0, 20.0, 21.0, 24.0, 22.0], patience=3, mode="min")
    assert bad == [0, 0, 1, 2, 0, 1, 2, 3]  # the mirror image of the series above
    assert progress.best_metric == 20.0
    assert reasons[7] == "no better dev acc in 3 validations"


def test_without_patience_or_the_metric_nothing_stops() -> None:
    _, reasons, _ = run([0.5, 0.4, 0.3, 0.2], patience=0)
    assert reasons == [""] * 4
    bad, _, progress = run([None, None], patience=1)  # the record lacks the metric
    assert bad == [0, 0] and progress.best_metric is None


def test_the_stopwatch_leaves_paused_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter([100.0, 103.0, 104.0, 110.0, 112.0])  # start, seconds, pause, resume, seconds
    monkeypatch.setattr(stopping.time, "perf_counter", lambda: next(now))
    clock = stopping.Stopwatch(50.0)
    assert clock.seconds() == 53.0
    with clock.paused():
        pass
    assert clock.seconds() == 50.0 + 12.0 - 6.0


@pytest.fixture
def handlers() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_noted_and_the_handlers_given_back(signum: int, handlers: None, caplog) -> None:
    previous = signal.getsignal(signum)
    signals = stopping.Signals()
    with signals.watching():
        assert signals.received == 0
        os.kill(os.getpid(), signum)
        assert signals.received == signum
    assert signal.getsignal(signum) == previous
    assert f"{signal.Signals(signum).name} received: stopping after this update" in caplog.text
    with signals.watching():  # watching again starts afresh
        assert signals.received == 0


def test_the_error_of_an_interrupted_run_names_the_update_and_checkpoint() -> None:
    error = stopping.interrupted(signal.SIGTERM, 7, Path("run/checkpoint_00000007.pt"))
    assert isinstance(error, Interrupted) and error.signum == signal.SIGTERM
    assert str(error) == ("stopped by SIGTERM at update 7; the checkpoint run/checkpoint_00000007.pt "
                          "holds it: run the same command again to resume")
