"""Data-parallel training on one CPU machine: N gloo processes against one process.

Trains the same copy model for the same number of updates three ways, in this one
benchmark run, and compares training tokens/s (``train_tokens_per_s`` of each run's
metrics, validation excluded):

- one process using every core (torch's default threads);
- one process with one thread;
- ``--nproc N`` processes with one thread each (torchrun's default), with the same
  global batch (``train.accumulate`` divided by N).

The ratio N-process / one-process-all-cores is what data parallelism costs or gains
on a CPU; N-process / one-thread is its scaling efficiency times N. Writes
``benchmarks/results/distributed_cpu-cpu.json``.

    python -m benchmarks distributed_cpu [--nproc 2] [--steps 100]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.common import arguments, device_name, write_json

MODEL = ["model.encoder_layers=3", "model.decoder_layers=3", "model.d_model=256", "model.d_ff=1024",
         "model.heads=4"]


def run(out: Path, steps: int, nproc: int, accumulate: int, threads: int | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    settings = [*MODEL, f"train.max_steps={steps}", "train.max_minutes=0", "train.max_tokens=2048",
                f"train.accumulate={accumulate}", f"train.eval_every={steps}",
                f"train.checkpoint_every={steps}", "train.log_every=50", "data.train_size=100000",
                "data.test_size=200", "data.dev_size=100"]
    cmd = [sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--nproc", str(nproc), "--out", str(out),
           "--device", "cpu", "--set", *settings]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"tokens_per_s": metrics["train_tokens_per_s"], "minutes": metrics["train_minutes"],
            "exact_match": metrics["exact_match"]}


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    n = args.nproc
    cores = os.cpu_count() or 1
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, nproc, accumulate, threads in [
            (f"1 process, {cores} threads", 1, n, None),
            ("1 process, 1 thread", 1, n, 1),
            (f"{n} processes, 1 thread each", n, 1, None),
        ]:
            results[name] = run(Path(scratch) / name.replace(" ", "_").replace(",", ""), args.steps, nproc,
                                accumulate, threads)
            print(f"{name:32s} {results[name]['tokens_per_s']:10.0f} tok/s  "
                  f"{results[name]['minutes'] * 60:6.1f} s  exact match {results[name]['exact_match']:.3f}")
    many = results[f"{n} processes, 1 thread each"]["tokens_per_s"]
    ratios = {
        f"{n} processes / 1 process all cores": many / results[f"1 process, {cores} threads"]["tokens_per_s"],
        f"{n} processes / 1 process 1 thread": many / results["1 process, 1 thread"]["tokens_per_s"],
    }
    for name, value in ratios.items():
        print(f"{name:40s} {value:.2f}x")
    device = torch.device("cpu")
    path = write_json("distributed_cpu", {"device": device_name(device), "cores": cores, "steps": args.steps,
                                          "model": MODEL, "runs": results, "ratios": ratios}, device)
    print(f"wrote {path}")
