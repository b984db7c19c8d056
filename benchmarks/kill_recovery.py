"""Recovery from ``kill -9`` at random moments.

Runs ``seqtrans run copy`` twice without interruption (the reference; the two must
agree), then N times: start the same command in a fresh run directory and data cache,
kill it with SIGKILL at a moment drawn uniformly over the faster reference's duration (so kills land in data
preparation, training steps, checkpoint writes, validation, averaging and test
decoding in proportion to their time), run the same command again to the end, and
compare its metrics and test predictions with the reference's. One thread per
process and a fixed seed make a recovered run exactly reproducible. Prints each
trial's phase at the kill and whether it recovered exactly; writes
``benchmarks/results/kill_recovery-cpu.json``.

    python -m benchmarks kill_recovery [--trials 20] [--seed 0]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import arguments, device_name, write_json

SETTINGS = ["data.train_size=200000", "data.dev_size=100", "data.test_size=300", "data.max_length=8",
            "train.max_steps=150", "train.max_minutes=0", "train.max_tokens=512", "train.warmup=200",
            "train.checkpoint_every=25", "train.eval_every=50", "train.log_every=10",
            "train.prepare_workers=2"]
COMPARED = ("exact_match", "token_accuracy", "train_steps", "test_sentences", "params")
# the last log line before a kill says what the run was doing (checked in this order)
PHASES = [("prepared data", "after data preparation"), ("prepare:", "preparing data"),
          ("vocabulary:", "after data preparation"), ("data:", "building the model"),
          ("model:", "training"), ("training stopped", "averaging"), ("validation", "after a validation"),
          ("resumed", "training"), ("step ", "training"), ("averaged", "test decoding"),
          ("test:", "finished"), ("run directory", "starting or preparing data")]


def command(out: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "seqtrans", "run", "copy", "--out", str(out), "--device", "cpu",
            "--set", *SETTINGS, f"train.data_cache={cache}"]


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def outcome(out: Path) -> tuple[dict[str, float], str]:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: metrics[k] for k in COMPARED}, (out / "predictions" / "test.txt").read_text()


def phase(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if " INFO " in line]
    if not lines:
        return "starting"
    last = lines[-1]
    return next((name for marker, name in PHASES if marker in last), last[-60:])


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    trials = []
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        durations, outcomes = [], []
        for r in range(2):  # twice: the first pays for cold caches, and both must agree
            started = time.perf_counter()
            subprocess.run(command(scratch / f"reference{r}", scratch / f"cache-reference{r}"), check=True,
                           env=environment(), capture_output=True)
            durations.append(time.perf_counter() - started)
            outcomes.append(outcome(scratch / f"reference{r}"))
        if outcomes[0] != outcomes[1]:
            raise SystemExit("two uninterrupted runs differ: recovery cannot be compared exactly")
        duration, reference = min(durations), outcomes[0]
        print(f"reference runs: {durations[0]:.1f} and {durations[1]:.1f} s, {reference[0]}")
        for i in range(args.trials):
            out, cache, log = scratch / f"run{i}", scratch / f"cache{i}", scratch / f"run{i}.log"
            at = rng.uniform(0.0, duration)
            with log.open("w") as err:
                job = subprocess.Popen(command(out, cache), env=environment(), stdout=subprocess.DEVNULL,
                                       stderr=err)
                try:
                    job.wait(timeout=at)
                    killed = False  # it ended first
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
                    killed = True
            where = phase(log) if killed else "after the end"
            again = subprocess.run(command(out, cache), env=environment(), capture_output=True, text=True)
            exact = again.returncode == 0 and outcome(out) == reference
            trials.append({"kill_at_s": round(at, 2), "killed": killed, "phase": where,
                           "rerun_status": again.returncode, "exact": exact,
                           "error": "" if again.returncode == 0 else again.stderr.strip().splitlines()[-1]})
            print(f"trial {i + 1:3d}: kill at {at:5.1f} s ({where:18s}) -> "
                  f"{'recovered exactly' if exact else 'NOT RECOVERED: ' + trials[-1]['error']}")
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
    recovered = sum(t["exact"] for t in trials)
    phases: dict[str, int] = {}
    for t in trials:
        phases[t["phase"]] = phases.get(t["phase"], 0) + 1
    print(f"recovered exactly: {recovered} of {len(trials)}; kills by phase: {phases}")
    device = torch.device("cpu")
    path = write_json("kill_recovery", {"device": device_name(device), "settings": SETTINGS,
                                        "reference_seconds": round(duration, 1), "trials": trials,
                                        "recovered": recovered, "phases": phases}, device)
    print(f"wrote {path}")
