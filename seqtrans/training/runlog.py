"""The run's record while it trains: a log line every ``train.log_every`` updates (with
the first; without a bar, a shorter one between them at least every 30 s) and one per
validation, the same records as JSON lines in ``train.jsonl``, TensorBoard's event
files, and the progress bar that stands in for the per-update lines on the console
(:mod:`seqtrans.training.tracking`); and the run's text log,
``run.log``, which holds every log record of the run (:func:`to_file`).

Every rank computes the lines (the window's loss is summed over ranks, a collective
all of them join); only the rank given a file, a directory or a bar writes them."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from seqtrans.runtime.heartbeat import EVERY_S, Heartbeat
from seqtrans.training import distributed
from seqtrans.training.progress import Progress, pausing
from seqtrans.training.tracking import UPDATE_LINE, TensorBoard, TrainingBar, console_above_bar

#: The logger of every training record; its name is the one run logs have always shown.
log = logging.getLogger("seqtrans.training.loop")

#: The lines of ``run.log``.
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RunLogFile(logging.Handler):
    """``run.log``: the records it is handed, held until :meth:`open` opens the file
    (to append), then written there as they come. So a run refused before it writes its
    directory leaves nothing behind, and the file of one that goes on still begins with
    what was logged before the directory was written."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.setFormatter(logging.Formatter(FILE_FORMAT))
        self._held: list[logging.LogRecord] = []
        self._file: logging.FileHandler | None = None

    def open(self) -> None:
        """Open the file (its directory must exist) and write the records held so far."""
        self.acquire()
        try:
            if self._file is None:
                self._file = logging.FileHandler(self.path, encoding="utf-8")
                self._file.setFormatter(self.formatter)
                for record in self._held:
                    self._file.emit(record)
                self._held.clear()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            self._held.append(record)
        else:
            self._file.emit(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


@contextlib.contextmanager
def to_file(path: Path) -> Iterator[RunLogFile]:
    """Every record the root logger passes handed to a :class:`RunLogFile` of ``path``
    while inside; the caller opens it once the run's directory is written.

    Where the process's logging is configured (the command line configures it), the file
    gets what that configuration lets through. Where nobody configured it (no handler on
    the root logger), the file gets the records of level INFO and above, as the command
    line's does, and standard error keeps showing what it showed before: the warnings
    that logging's last resort prints, which a handler of ours would otherwise silence."""
    root = logging.getLogger()
    level = root.level
    file = RunLogFile(path)
    added: list[logging.Handler] = [file]
    if not root.handlers:
        if logging.lastResort is not None:
            console = logging.StreamHandler(sys.stderr)
            console.setLevel(max(root.getEffectiveLevel(), logging.lastResort.level))
            added.append(console)
        if root.getEffectiveLevel() > logging.INFO:
            root.setLevel(logging.INFO)
    for handler in added:
        root.addHandler(handler)
    try:
        yield file
    finally:
        for handler in added:
            root.removeHandler(handler)
        file.close()
        root.setLevel(level)


class RunLog:
    """Writes a run's log lines to ``log_file`` (JSON lines), ``tensorboard`` (a
    directory) and a bar on standard error when ``progress_bar``; each may be off."""

    def __init__(self, *, log_file: Path | None = None, tensorboard: Path | None = None,
                 progress_bar: bool = False, log_every: int, max_steps: int, max_minutes: float,
                 heartbeat_s: float = EVERY_S) -> None:
        self.log_file = log_file
        self.tensorboard_dir = tensorboard
        self.progress_bar = progress_bar
        self.log_every = log_every
        self.max_steps = max_steps
        self.max_minutes = max_minutes
        self._tensorboard: TensorBoard | None = None
        self._bar: TrainingBar | None = None
        self._window_loss, self._window_tokens, self._window_start = 0.0, 0, time.perf_counter()
        self._heartbeat = Heartbeat(heartbeat_s)

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """TensorBoard's event files open, and the console written above the bar."""
        with contextlib.ExitStack() as stack:
            if self.tensorboard_dir is not None:
                self._tensorboard = TensorBoard(self.tensorboard_dir)
                stack.callback(self._close_tensorboard)
            if self.progress_bar:
                stack.enter_context(console_above_bar())
            yield

    def _close_tensorboard(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def start(self, progress: Progress) -> None:
        """Show the bar at where training stands, and open the first window of updates."""
        if self.progress_bar:
            self._bar = TrainingBar(max_steps=self.max_steps, max_minutes=self.max_minutes,
                                    step=progress.step, seconds=progress.seconds)
        self._window_loss, self._window_tokens, self._window_start = 0.0, 0, time.perf_counter()
        self._heartbeat.reset()

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Time spent inside does not count in the window's tokens per second."""
        return pausing(self._skip)

    def _skip(self, seconds: float) -> None:
        self._window_start += seconds

    def update(self, progress: Progress, *, loss: float, tokens: int, lr: float) -> None:
        """Note an update taken (this rank's summed ``loss``, the update's target ``tokens``,
        the rate it used); at the first and every ``log_every``-th, write a line of the
        loss per token since the last one. Without a bar, a shorter line (no loss: that
        would be a collective the ranks do not agree to join by their own clocks) comes
        between them whenever :data:`~seqtrans.runtime.heartbeat.EVERY_S` seconds pass
        without a line, so that a log file shows a slow run is alive."""
        self._window_loss += loss
        self._window_tokens += tokens
        step = progress.step
        if self._bar is not None:
            self._bar.advance(step, progress.seconds)
        if step % self.log_every != 0 and step != 1:
            if self._bar is None and self._heartbeat.due():
                elapsed = time.perf_counter() - self._window_start
                log.info("step %d | epoch %d | %.0f tok/s (the loss comes every %d updates)", step,
                         progress.epoch, self._window_tokens / max(elapsed, 1e-9), self.log_every)
            return
        self._heartbeat.reset()
        elapsed = time.perf_counter() - self._window_start
        (summed,) = distributed.all_sum([self._window_loss])
        line = {"step": step, "epoch": progress.epoch, "loss": summed / self._window_tokens,
                "lr": lr, "tokens_per_s": self._window_tokens / max(elapsed, 1e-9)}
        if self._bar is not None:
            self._bar.show(line)
        log.info("step %d | epoch %d | loss %.4f | lr %.3e | %.0f tok/s", step,
                 progress.epoch, line["loss"], line["lr"], line["tokens_per_s"], extra=UPDATE_LINE)
        self.write({"event": "train", **line, "seconds": round(progress.seconds, 3)})
        self._window_loss, self._window_tokens, self._window_start = 0.0, 0, time.perf_counter()

    def validation(self, record: Mapping[str, float], seconds: float) -> None:
        log.info("validation | %s", " | ".join(f"{k} {v:.4g}" for k, v in record.items()))
        self.write({"event": "validation", **record, "seconds": round(seconds, 3)})

    def write(self, record: Mapping[str, Any]) -> None:
        """One record to ``train.jsonl`` and, if it is a train or validation one, to TensorBoard."""
        if self.log_file is not None:
            with self.log_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            if record["event"] == "train":
                self._tensorboard.train(record)
            elif record["event"] == "validation":
                self._tensorboard.validation(record)
