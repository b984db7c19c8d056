"""The run log: which updates get a line, the loss per token of each window (against
sums by hand), the records of train.jsonl, what TensorBoard is handed, and what run.log
gets."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from seqtrans.training import runlog
from seqtrans.training.progress import Progress
from seqtrans.training.runlog import RunLog

UPDATES = [(6.0, 3), (10.0, 4), (2.0, 2), (9.0, 3), (1.0, 1), (4.0, 5)]  # (summed loss, tokens)


def records(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def feed(log: RunLog) -> None:
    progress = Progress(epoch=2)
    log.start(progress)
    for step, (loss, tokens) in enumerate(UPDATES, start=1):
        progress.step, progress.seconds = step, step * 1.25
        log.update(progress, loss=loss, tokens=tokens, lr=step / 1000)


def test_lines_at_the_first_update_and_every_log_every_with_the_windows_loss(tmp_path: Path, caplog) -> None:
    log = RunLog(log_file=tmp_path / "train.jsonl", log_every=3, max_steps=100, max_minutes=0)
    with caplog.at_level(logging.INFO, logger="seqtrans.training.loop"):
        feed(log)
    lines = records(tmp_path / "train.jsonl")
    assert [r["step"] for r in lines] == [1, 3, 6]
    assert [r["loss"] for r in lines] == [6.0 / 3, (10.0 + 2.0) / (4 + 2), (9.0 + 1.0 + 4.0) / (3 + 1 + 5)]
    assert list(lines[0]) == ["event", "step", "epoch", "loss", "lr", "tokens_per_s", "seconds"]
    assert lines[1]["event"] == "train" and lines[1]["epoch"] == 2 and lines[1]["lr"] == 0.003
    assert [r["seconds"] for r in lines] == [1.25, 3.75, 7.5]
    assert "step 3 | epoch 2 | loss 2.0000 | lr 3.000e-03 |" in caplog.text


def test_without_a_bar_a_line_comes_whenever_the_heartbeat_is_due(tmp_path: Path, caplog) -> None:
    log = RunLog(log_file=tmp_path / "train.jsonl", log_every=3, max_steps=100, max_minutes=0, heartbeat_s=0)
    with caplog.at_level(logging.INFO, logger="seqtrans.training.loop"):
        feed(log)
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" |")[0] for m in said] == [f"step {s}" for s in range(1, 7)]  # every update, here
    assert said[1].startswith("step 2 | epoch 2 | ")
    assert said[1].endswith("tok/s (the loss comes every 3 updates)")
    assert [r["step"] for r in records(tmp_path / "train.jsonl")] == [1, 3, 6]  # the record keeps its cadence
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqtrans.training.loop"):
        feed(RunLog(log_every=3, max_steps=100, max_minutes=0))  # 30 s do not pass here
    assert [r.getMessage().split(" |")[0] for r in caplog.records] == ["step 1", "step 3", "step 6"]


def test_tokens_per_second_leave_paused_time_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = RunLog(log_file=tmp_path / "train.jsonl", log_every=1, max_steps=100, max_minutes=0)
    # start, update 1 (line, new window), pause, resume, update 2 (line), new window
    clock = iter([10.0, 12.0, 12.0, 20.0, 50.0, 54.0, 54.0])
    monkeypatch.setattr(runlog.time, "perf_counter", lambda: next(clock))
    progress = Progress()
    log.start(progress)
    progress.step = 1
    log.update(progress, loss=1.0, tokens=100, lr=0.1)
    with log.paused():
        pass
    progress.step = 2
    log.update(progress, loss=1.0, tokens=120, lr=0.1)
    rates = [r["tokens_per_s"] for r in records(tmp_path / "train.jsonl")]
    assert rates == [100 / 2.0, 120 / (54.0 - 12.0 - 30.0)]


def test_validations_are_logged_and_recorded(tmp_path: Path, caplog) -> None:
    log = RunLog(log_file=tmp_path / "train.jsonl", log_every=10, max_steps=100, max_minutes=0)
    with caplog.at_level(logging.INFO, logger="seqtrans.training.loop"):
        log.validation({"step": 4, "dev_loss": 2.5, "dev_acc": 0.123456}, 3.14159)
    assert "validation | step 4 | dev_loss 2.5 | dev_acc 0.1235" in caplog.text
    assert records(tmp_path / "train.jsonl") == [
        {"event": "validation", "step": 4, "dev_loss": 2.5, "dev_acc": 0.123456, "seconds": 3.142}]


def test_a_rank_without_a_file_writes_nothing(tmp_path: Path) -> None:
    feed(RunLog(log_every=1, max_steps=100, max_minutes=0))
    assert not list(tmp_path.iterdir())


class FakeTensorBoard:
    made: list[FakeTensorBoard] = []

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: list[tuple[str, Mapping[str, float]]] = []
        self.closed = False
        FakeTensorBoard.made.append(self)

    def train(self, line: Mapping[str, float]) -> None:
        self.seen.append(("train", line))

    def validation(self, record: Mapping[str, float]) -> None:
        self.seen.append(("validation", record))

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_the_train_and_validation_records_and_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runlog, "TensorBoard", FakeTensorBoard)
    log = RunLog(tensorboard=tmp_path / "tb", log_every=3, max_steps=100, max_minutes=0)
    with log.following():
        feed(log)
        log.validation({"step": 6, "dev_loss": 1.0}, 7.5)
        log.write({"event": "other"})
    (board,) = FakeTensorBoard.made
    assert board.directory == tmp_path / "tb" and board.closed
    assert [(kind, r["step"]) for kind, r in board.seen] == [("train", 1), ("train", 3), ("train", 6),
                                                            ("validation", 6)]


def test_the_run_log_file_of_an_unconfigured_process_gets_info_and_the_console_still_warnings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = io.StringIO()
    monkeypatch.setattr(sys, "stderr", console)
    root, logger = logging.getLogger(), logging.getLogger("seqtrans.somewhere")
    handlers, level = root.handlers, root.level
    root.handlers = []  # as in a script that configured no logging (pytest's are put back below)
    root.setLevel(logging.WARNING)
    try:
        with runlog.to_file(tmp_path / "run.log") as file:
            logger.info("into the file")
            file.open()
            logger.warning("into the file and onto the console")
        logger.info("after the run")
        assert root.handlers == [] and root.level == logging.WARNING  # logging as it was
    finally:
        root.handlers = handlers
        root.setLevel(level)
    lines = (tmp_path / "run.log").read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO seqtrans.somewhere: into the file",
        "WARNING seqtrans.somewhere: into the file and onto the console"]
    assert console.getvalue() == "into the file and onto the console\n"


def test_the_run_log_file_gets_what_configured_logging_lets_through(tmp_path: Path) -> None:
    root, logger = logging.getLogger(), logging.getLogger("seqtrans.somewhere")
    level = root.level
    root.setLevel(logging.WARNING)  # pytest's handlers are on the root logger: it is configured
    try:
        with runlog.to_file(tmp_path / "run.log") as file:
            file.open()
            logger.info("left out, as on the console")
            logger.warning("kept")
        assert root.level == logging.WARNING
    finally:
        root.setLevel(level)
    lines = (tmp_path / "run.log").read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["WARNING seqtrans.somewhere: kept"]


def test_the_run_log_file_holds_records_until_it_is_opened_and_is_not_written_if_never(
        tmp_path: Path) -> None:
    logger = logging.getLogger("seqtrans.somewhere")
    with caught(runlog.RunLogFile(tmp_path / "refused.log")):
        logger.warning("a run refused before its directory was written")
    assert not (tmp_path / "refused.log").exists()
    with caught(runlog.RunLogFile(tmp_path / "run.log")) as file:
        logger.warning("before")
        assert not (tmp_path / "run.log").exists()
        file.open()
        logger.warning("after")
    lines = (tmp_path / "run.log").read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["WARNING seqtrans.somewhere: before",
                                                         "WARNING seqtrans.somewhere: after"]


@contextlib.contextmanager
def caught(handler: runlog.RunLogFile) -> Iterator[runlog.RunLogFile]:
    """``handler`` on the root logger while inside, then closed."""
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        handler.close()
