"""Data-parallel jobs as a user starts them, ``seqtrans run --nproc`` and torchrun: the
metrics of one process, and a rank that is killed or stops answering, or a launcher told
to stop (the training and decoding they run: test_distributed.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_distributed import clean_env

from seqtrans.training import checkpoint

# a copy run short enough for a test, with settings that make the ranks' work comparable
RUN = ["data.train_size=1500", "data.dev_size=40", "data.test_size=80", "data.max_length=6",
       "data.vocab_size=8", "train.max_steps=120", "train.max_minutes=0", "train.max_tokens=256",
       "train.warmup=200", "train.checkpoint_every=20", "train.eval_every=60", "train.log_every=20",
       "train.adam_eps=1e-6"]


def seqtrans(*args: str, timeout: float = 300,
             threads: int | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.run([sys.executable, "-m", "seqtrans", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_nproc_and_torchrun_reach_the_metrics_of_one_process(tmp_path: Path) -> None:
    # torchrun gives each rank one thread; one process with another thread count sums in
    # another order, and a hundred updates at a high learning rate make that a visible difference
    one = seqtrans("-q", "run", "copy", "--out", str(tmp_path / "one"), "--set", *RUN, "train.accumulate=2",
                   threads=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = seqtrans("-q", "run", "copy", "--nproc", "2", "--out", str(tmp_path / "two"), "--set", *RUN,
                   "train.tensorboard=true")
    assert two.returncode == 0, two.stderr[-3000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "seqtrans", "-q", "run", "copy", "--out", str(tmp_path / "torchrun"), "--set", *RUN]
    torchrun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    metrics = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two", "torchrun")]
    for m in metrics:
        assert m["train_steps"] == 120
    assert 0.3 < metrics[0]["exact_match"] < 1  # it learned something that can differ
    for key in ("exact_match", "token_accuracy"):
        assert metrics[1][key] == metrics[0][key] == metrics[2][key], key
    lines = [(tmp_path / d / "predictions" / "test.txt").read_text().splitlines() for d in ("one", "two")]
    assert len(lines[1]) == 80 and lines[1] == lines[0]
    log = [json.loads(line) for line in (tmp_path / "two" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "validation"] == [60, 120]  # rank 0 alone logs
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "two" / "tb").glob("events.*")  # rank 0 alone writes them
    scalars = EventAccumulator(str(events))
    scalars.Reload()
    assert [e.step for e in scalars.Scalars("dev/loss")] == [60, 120]


def signal_rank_1(tmp_path: Path, signum: int, *settings: str) -> tuple[float, str]:
    """Start a two-process run, send rank 1 ``signum`` once it has written a checkpoint,
    and wait for the job to end. -> (seconds from the signal to the end, stderr)"""
    args = [sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--nproc", "2", "--out", str(tmp_path),
            "--set", *RUN, "train.max_steps=100000", "train.max_minutes=5", *settings]
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    victim = None
    try:
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if checkpoint.list_checkpoints(tmp_path / "checkpoints"):  # training is under way
                victim = _rank_process(job.pid, 1)
        assert victim is not None, "rank 1 never started"
        os.kill(victim, signum)
        sent = time.monotonic()
        _, err = job.communicate(timeout=180)
        return time.monotonic() - sent, err
    finally:
        job.kill()
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        assert job.wait() == 1


def test_a_killed_rank_ends_the_job_naming_the_rank(tmp_path: Path) -> None:
    seconds, err = signal_rank_1(tmp_path, signal.SIGKILL)
    assert seconds < 30
    assert "rank 1 of 2" in err and "SIGKILL" in err, err[-3000:]
    # the last checkpoint stays usable
    checkpoint.load(checkpoint.list_checkpoints(tmp_path / "checkpoints")[-1])


def test_a_rank_that_stops_answering_ends_the_job_after_the_timeout(tmp_path: Path) -> None:
    seconds, err = signal_rank_1(tmp_path, signal.SIGSTOP, "train.dist_timeout=5")
    assert 5 <= seconds < 60
    assert "(rank 0): error: lost contact with the other ranks" in err, err[-3000:]
    assert "train.dist_timeout (5 s)" in err


def _rank_process(ancestor: int, rank: int) -> int | None:
    """The pid of the descendant of ``ancestor`` that torchrun started as ``rank``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID" in b"\n".join(environ) \
                and ancestor in _ancestors(int(entry.name)):
            return int(entry.name)
    return None


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        out.append(pid)
    return out


def test_sigterm_to_the_launcher_stops_every_rank_with_a_checkpoint(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--nproc", "2", "--out", str(tmp_path),
            "--set", *RUN, "train.max_steps=100000", "train.max_minutes=5"]
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.list_checkpoints(tmp_path / "checkpoints"):
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.2)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "seqtrans run: stopped by SIGTERM: each rank finished its update" in err
    step = int(err.split("(rank 0): stopped by SIGTERM at update ")[1].split(";")[0])
    assert checkpoint.list_checkpoints(tmp_path / "checkpoints")[-1].name == checkpoint.checkpoint_name(step)
