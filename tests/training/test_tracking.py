"""Following a run: the training bar and its postfix, the plain log lines off a terminal,
TensorBoard event files holding the log's numbers."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqtrans import resolve_config
from seqtrans.cli import build_parser
from seqtrans.cli.arguments import progress
from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.errors import ConfigError
from seqtrans.model.transformer import Transformer
from seqtrans.pipeline import run
from seqtrans.training.loop import Trainer
from seqtrans.training.tracking import require_tensorboard, seconds_left, time_binds

MODEL = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0)


def _pairs() -> Pairs:
    seqs = [[4 + (i * 7 + j) % 8 for j in range(1 + i % 6)] for i in range(40)]
    return Pairs([s + [2] for s in seqs], seqs)


def _trainer(tmp: Path, *, bar: bool, **train: object) -> Trainer:
    options = {"max_tokens": 64, "warmup": 10, "checkpoint_every": 1000, "eval_every": 4, "log_every": 2,
               "keep_checkpoints": 1, "average_last": 1, "max_steps": 6, **train}
    config = RunConfig(task="test", model=MODEL, train=TrainConfig(**options), seed=3)
    torch.manual_seed(0)
    model = Transformer(MODEL, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    return Trainer(model, config, _pairs(), directory=tmp / "ckpt", device=torch.device("cpu"),
                   dev=_pairs(), log_file=tmp / "train.jsonl", progress_bar=bar)


@pytest.fixture
def console(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """A string for standard error with a console log handler on it, as the CLI sets up;
    a test puts it in place itself (pytest sets its own between a fixture and the test).
    No terminal size in the environment: the bar would be cut to ``$COLUMNS`` (which a
    parallel test run's workers inherit) and the tests read its end."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    stderr = io.StringIO()
    handler = logging.StreamHandler(stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    caplog.set_level(logging.INFO)
    yield stderr
    root.removeHandler(handler)


def _records(path: Path, event: str) -> list[dict[str, float]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


def test_the_budget_that_binds_and_the_time_left() -> None:
    # 10 of 100 updates in 20 s: 2 s an update, 180 s left without a time budget
    assert seconds_left(10, 20.0, max_steps=100, max_minutes=0) == 180.0
    assert not time_binds(10, 20.0, max_steps=100, max_minutes=0)
    # with 1 minute, 40 s of it are left: time binds (a third spent against a tenth)
    assert seconds_left(10, 20.0, max_steps=100, max_minutes=1) == 40.0
    assert time_binds(10, 20.0, max_steps=100, max_minutes=1)
    # with 10 minutes the updates run out first
    assert seconds_left(10, 20.0, max_steps=100, max_minutes=10) == 180.0
    assert not time_binds(10, 20.0, max_steps=100, max_minutes=10)
    assert seconds_left(0, 0.0, max_steps=100, max_minutes=0) is None
    assert seconds_left(0, 0.0, max_steps=100, max_minutes=2) == 120.0
    # resumed at update 10 after 200 s (a slow earlier process); 10 more in 20 s: 2 s an update
    assert seconds_left(20, 220.0, max_steps=100, max_minutes=0, since=(10, 200.0)) == 160.0
    assert seconds_left(10, 200.0, max_steps=100, max_minutes=0, since=(10, 200.0)) is None


def test_off_a_terminal_training_logs_plain_lines(tmp_path: Path, console: io.StringIO,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", console)
    _trainer(tmp_path, bar=False).fit()
    text = console.getvalue()
    assert "\r" not in text and "train:" not in text  # no bar
    lines = [line for line in text.splitlines() if line.startswith("step ")]
    logged = _records(tmp_path / "train.jsonl", "train")
    assert [int(line.split()[1]) for line in lines] == [r["step"] for r in logged] == [1, 2, 4, 6]
    assert f"loss {logged[-1]['loss']:.4f}" in lines[-1]


def test_the_bar_shows_the_last_log_line_and_replaces_it_on_the_console(
        tmp_path: Path, console: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", console)
    file_log = logging.FileHandler(tmp_path / "run.log", encoding="utf-8")
    root = logging.getLogger()
    root.addHandler(file_log)
    handlers = list(root.handlers)
    try:
        _trainer(tmp_path, bar=True).fit()
        assert root.handlers == handlers  # the console's handler is given back
    finally:
        root.removeHandler(file_log)
        file_log.close()
    text = console.getvalue()
    last = text.split("\r")[-1].strip().splitlines()[0]  # the bar as it was left
    line = _records(tmp_path / "train.jsonl", "train")[-1]
    assert last.startswith("train: 100%") and "6/6 updates" in last
    assert (f"loss={line['loss']:.3f}, lr={line['lr']:.2e}, tok/s={line['tokens_per_s']:.0f}, left=00:00"
            in last), last
    # the per-update lines reach the log file only; validations still show on the console
    assert "step 1 |" not in text and "validation | step 4" in text
    logged = (tmp_path / "run.log").read_text()
    assert "step 1 |" in logged and "step 6 |" in logged


def test_the_bar_counts_minutes_when_the_time_budget_binds(tmp_path: Path, console: io.StringIO,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", console)
    result = _trainer(tmp_path, bar=True, max_steps=100000, max_minutes=0.0001, eval_every=1000).fit()
    assert "time budget" in result.progress.stop_reason
    last = console.getvalue().split("\r")[-1].strip().splitlines()[0]
    assert "/0.0001 min" in last and "left=00:00" in last, last


def test_the_progress_option_forces_bars_on_or_off() -> None:
    parser = build_parser()
    assert not sys.stderr.isatty()
    assert not progress(parser.parse_args(["tasks"]))
    assert progress(parser.parse_args(["--progress", "on", "tasks"]))
    assert progress(parser.parse_args(["-q", "--progress", "on", "tasks"]))
    assert not progress(parser.parse_args(["--progress", "off", "tasks"]))


TINY_COPY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
             "model.heads=2", "data.train_size=200", "data.dev_size=10", "data.test_size=10",
             "data.max_length=5", "train.max_steps=6", "train.eval_every=3", "train.checkpoint_every=3",
             "train.log_every=2", "train.max_tokens=128", "train.keep_checkpoints=2", "train.average_last=1",
             "train.max_minutes=0", "decode.beam=1"]


def test_tensorboard_files_hold_the_logged_numbers(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = resolve_config("copy", overrides=[*TINY_COPY, "train.tensorboard=true"])
    run(config, tmp_path / "run", device="cpu")
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    log = tmp_path / "run" / "train.jsonl"
    expected: dict[str, dict[int, float]] = {}
    for record in _records(log, "train"):
        for key in ("loss", "lr", "tokens_per_s"):
            expected.setdefault(f"train/{key}", {})[record["step"]] = record[key]
    for record in _records(log, "validation"):
        for key, value in record.items():
            if key.startswith("dev_"):
                expected.setdefault(f"dev/{key[4:]}", {})[record["step"]] = value
    assert set(expected["train/loss"]) == {1, 2, 4, 6} and set(expected["dev/loss"]) == {3, 6}
    assert {"dev/ppl", "dev/exact_match"} <= set(expected)  # the copy task's metric
    assert set(scalars) == set(expected)
    for tag, values in expected.items():
        as_float32 = {step: float(torch.tensor(v, dtype=torch.float32)) for step, v in values.items()}
        assert scalars[tag] == as_float32, tag  # event files hold float32


def test_tensorboard_without_its_package_is_a_config_error(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import now fails
    with pytest.raises(ConfigError, match="train.tensorboard.*seqtrans\\[tensorboard\\]"):
        require_tensorboard()
    config = resolve_config("copy", overrides=[*TINY_COPY, "train.tensorboard=true"])
    with pytest.raises(ConfigError, match="train.tensorboard"):
        run(config, tmp_path / "run", device="cpu")
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything was written


def test_the_command_line_forces_the_bar_off_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = ["--progress", "on", "run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY_COPY]
    done = subprocess.run([sys.executable, "-m", "seqtrans", *command], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    bar = [frame for frame in done.stderr.splitlines() if frame.startswith("train:")]  # \r read as \n
    assert bar and "6/6 updates" in bar[-1] and "loss=" in bar[-1]
    assert " step 1 |" not in done.stderr and "validation | step 3" in done.stderr
    logged = (out / "run.log").read_text()
    assert " step 1 |" in logged and " step 6 |" in logged
