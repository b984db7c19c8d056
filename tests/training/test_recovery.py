"""`seqtrans run` stopped by a signal or killed, then run again with the same command,
ends with the metrics and predictions of a run that was never stopped (CPU, one
thread, fixed seed). ``benchmarks/kill_recovery.py`` repeats this at random moments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqtrans.training import checkpoint

SETTINGS = ["data.train_size=1500", "data.dev_size=40", "data.test_size=80", "data.max_length=6",
            "data.vocab_size=8", "train.max_steps=120", "train.max_minutes=0", "train.max_tokens=256",
            "train.warmup=200", "train.checkpoint_every=20", "train.eval_every=60", "train.log_every=20"]
#: What a repeated run must reproduce (the timings differ).
COMPARED = ("exact_match", "token_accuracy", "train_steps", "test_sentences", "params")


def command(out: Path) -> list[str]:
    return [sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--out", str(out), "--device", "cpu",
            "--set", *SETTINGS, f"train.data_cache={out.parent / 'cache'}"]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # the same sums in the same order each time


def outcome(out: Path) -> tuple[dict[str, float], str]:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: metrics[k] for k in COMPARED}, (out / "predictions" / "test.txt").read_text()


def start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(command(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env())


def wait_for_checkpoints(out: Path, job: subprocess.Popen[str], count: int) -> None:
    deadline = time.monotonic() + 120
    while len(checkpoint.list_checkpoints(out / "checkpoints")) < count:
        assert job.poll() is None, "the run ended before it was interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.05)


def finish(out: Path) -> None:
    done = subprocess.run(command(out), capture_output=True, text=True, timeout=300, env=env())
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, float], str]:
    out = tmp_path_factory.mktemp("reference") / "run"
    finish(out)
    return outcome(out)


def test_a_run_killed_during_training_resumes_to_the_same_result(reference, tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = start(out)
    wait_for_checkpoints(out, job, 2)
    job.kill()
    job.wait()
    finish(out)
    assert outcome(out) == reference


def test_sigterm_checkpoints_the_update_and_says_how_to_resume(reference, tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = start(out)
    wait_for_checkpoints(out, job, 1)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM at update" in err and "run the same command again to resume" in err, err
    step = int(err.split("stopped by SIGTERM at update ")[1].split(";")[0])
    assert checkpoint.list_checkpoints(out / "checkpoints")[-1].name == checkpoint.checkpoint_name(step)
    finish(out)
    assert outcome(out) == reference


SECOND_SIGNAL = """
import os, signal, sys
import torch
from seqtrans.config import ModelConfig, RunConfig, TrainConfig
from seqtrans.data.batches import Pairs
from seqtrans.model.transformer import Transformer
from seqtrans.training.loop import Trainer

model_config = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
config = RunConfig(task="test", model=model_config, train=TrainConfig(
    max_tokens=64, warmup=10, max_steps=50, checkpoint_every=5, keep_checkpoints=5, average_last=1))
pairs = Pairs([[4 + i % 7, 5, 2] for i in range(40)], [[4 + i % 7, 5] for i in range(40)])
model = Transformer(model_config, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
trainer = Trainer(model, config, pairs, directory=sys.argv[1], device=torch.device("cpu"))
update = trainer._update

def twice(group):
    if trainer.state.step == 7:
        os.kill(os.getpid(), signal.SIGTERM)  # handled before the next line runs
        os.kill(os.getpid(), signal.SIGTERM)
    return update(group)

trainer._update = twice
trainer.fit()
"""


def test_a_second_signal_ends_the_run_at_once_leaving_complete_checkpoints(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SECOND_SIGNAL, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]  # ended by the signal's own action
    assert "SIGTERM received" in done.stderr
    found = checkpoint.list_checkpoints(tmp_path)
    assert [p.name for p in found] == [checkpoint.checkpoint_name(5)]  # no checkpoint of update 8
    checkpoint.load(found[0])  # complete and verified
