"""Following a training run while it runs: a progress bar on a terminal and
TensorBoard event files. Both show the numbers of the log (``DIR/run.log`` and
``DIR/train.jsonl``), which stays the run's record.

The bar counts updates out of ``train.max_steps``, or minutes out of
``train.max_minutes`` while the time budget is being spent faster; its postfix holds
the last log line's loss, learning rate and tokens/s, and the time left of the budget.
While it is shown, log lines meant for the console are written above it, and the
per-update lines (marked :data:`UPDATE_LINE`) go only to the other handlers: the bar
carries their numbers.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from seqtrans.errors import ConfigError

#: ``extra`` of the per-update log records: ``log.info(..., extra=UPDATE_LINE)``.
UPDATE_LINE = {"seqtrans_update_line": True}

#: Seconds between redraws of the bar.
REFRESH = 0.5


def time_binds(step: int, seconds: float, *, max_steps: int, max_minutes: float) -> bool:
    """Whether the time budget is being spent faster than the budget of updates."""
    return bool(max_minutes) and seconds / (max_minutes * 60) > step / max_steps


def seconds_left(step: int, seconds: float, *, max_steps: int, max_minutes: float,
                 since: tuple[int, float] = (0, 0.0)) -> float | None:
    """Training seconds until the budget is spent: what is left of the time budget, or
    the updates left at the rate since update ``since[0]`` (reached after ``since[1]``
    seconds: where this process resumed, as an earlier one may have run on a busier
    machine), whichever ends first (None before a rate is known and without a time budget)."""
    left = []
    if max_minutes:
        left.append(max(max_minutes * 60 - seconds, 0.0))
    first, then = since
    if step > first and seconds > then:
        left.append(max(max_steps - step, 0) * (seconds - then) / (step - first))
    return min(left) if left else None


def postfix(line: Mapping[str, float] | None, left: float | None) -> dict[str, str]:
    """The bar's postfix from the last training log line (if any yet) and the seconds left."""
    shown = {} if line is None else {"loss": f"{line['loss']:.3f}", "lr": f"{line['lr']:.2e}",
                                     "tok/s": f"{line['tokens_per_s']:.0f}"}
    return {**shown, "left": "?" if left is None else tqdm.format_interval(left)}


class TrainingBar:
    """The training bar on ``file`` (default: standard error)."""

    def __init__(self, *, max_steps: int, max_minutes: float, step: int, seconds: float,
                 file: IO[str] | None = None) -> None:
        self.max_steps = max_steps
        self.max_minutes = max_minutes
        self._bar = tqdm(total=max_steps, initial=step, desc="train", unit="updates", file=file,
                         dynamic_ncols=True, leave=True,
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                                    "[{elapsed}{postfix}]")
        self._shown = 0.0
        self._line: Mapping[str, float] | None = None
        self._since = (step, seconds)
        self.advance(step, seconds)

    def advance(self, step: int, seconds: float) -> None:
        """Move to update ``step`` after ``seconds`` of training."""
        bar = self._bar
        if time_binds(step, seconds, max_steps=self.max_steps, max_minutes=self.max_minutes):
            bar.n, bar.total, bar.unit = round(seconds / 60, 1), self.max_minutes, "min"
        else:
            bar.n, bar.total, bar.unit = step, self.max_steps, "updates"
        self._left = seconds_left(step, seconds, max_steps=self.max_steps, max_minutes=self.max_minutes,
                                  since=self._since)
        bar.set_postfix(postfix(self._line, self._left), refresh=False)
        self._redraw()

    def show(self, line: Mapping[str, float]) -> None:
        """Show the numbers of a training log line."""
        self._line = line
        self._bar.set_postfix(postfix(line, self._left), refresh=False)
        self._redraw(now=True)

    def _redraw(self, *, now: bool = False) -> None:
        clock = time.monotonic()
        if now or clock - self._shown >= REFRESH:
            self._bar.refresh()
            self._shown = clock

    def close(self) -> None:
        self._bar.close()  # drawn once more as it ends


class _AboveBar(logging.Handler):
    """Writes what a console handler would, above the bars on its stream."""

    def __init__(self, console: logging.StreamHandler[Any]) -> None:
        super().__init__(console.level)
        self.setFormatter(console.formatter)
        self.stream = console.stream
        for f in console.filters:
            self.addFilter(f)
        self.addFilter(lambda record: not getattr(record, "seqtrans_update_line", False))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def console_above_bar() -> Iterator[None]:
    """While a bar is shown, the root logger's handlers on standard error or output
    write above it and leave out the per-update lines; other handlers are untouched."""
    root = logging.getLogger()
    before = list(root.handlers)
    consoles = {sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__}
    root.handlers = [_AboveBar(h) if type(h) is logging.StreamHandler and h.stream in consoles else h
                     for h in before]
    try:
        yield
    finally:
        root.handlers = before


def require_tensorboard() -> None:
    """A ConfigError unless ``torch.utils.tensorboard`` can write event files."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as exc:
        raise ConfigError("train.tensorboard", f"needs the tensorboard package ({exc}); "
                          "pip install 'seqtrans[tensorboard]', or set train.tensorboard=false") from None


class TensorBoard:
    """Event files under ``directory`` holding the scalars of the log: ``train/loss``,
    ``train/lr``, ``train/tokens_per_s`` at each training log line, and each validation's
    ``dev/loss``, ``dev/ppl`` and ``dev/METRIC``, all against the update."""

    def __init__(self, directory: str | Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(directory))

    def train(self, line: Mapping[str, float]) -> None:
        for key in ("loss", "lr", "tokens_per_s"):
            self._writer.add_scalar(f"train/{key}", line[key], int(line["step"]))

    def validation(self, record: Mapping[str, float]) -> None:
        for key, value in record.items():
            if key.startswith("dev_"):
                self._writer.add_scalar(f"dev/{key[4:]}", value, int(record["step"]))
        self._writer.flush()  # validations are rare and worth seeing at once

    def close(self) -> None:
        self._writer.close()
