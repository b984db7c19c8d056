"""Start, ``kill -9`` at an update and resume under torchrun on the suite's device.

Two uninterrupted runs of ``seqtrans run copy`` under ``torchrun --nproc_per_node 1``
(do two runs on this device agree at all?), then the same command killed with SIGKILL
(the agent and its rank, as a lost machine would) once its log reports update
``kill_at``, between two checkpoints, and run again to the end: its metrics and test
predictions against the first reference's.

A world of one process joins no process group (seqtrans.training.distributed.init), so
this exercises torchrun's agent, the device and the checkpoints, not NCCL's collectives:
those need two ranks, and NCCL refuses two ranks on one GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import ROOT

SETTINGS = ["data.train_size=200000", "data.dev_size=100", "data.test_size=300", "data.max_length=8",
            "train.max_minutes=0", "train.max_tokens=512", "train.warmup=200",
            "train.log_every=10"]
COMPARED = ("exact_match", "token_accuracy", "train_steps", "test_sentences", "params")


def command(out: Path, cache: Path, device: torch.device, steps: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "-m", "seqtrans", "run", "copy", "--out", str(out), "--device", device.type,
            "--set", *settings(steps), f"data.cache_dir={cache}"]


def settings(steps: int) -> list[str]:
    """Six checkpoints and three validations over ``steps`` updates."""
    return [*SETTINGS, f"train.max_steps={steps}", f"train.checkpoint_every={max(steps // 6, 1)}",
            f"train.eval_every={max(steps // 3, 1)}"]


def outcome(out: Path) -> dict[str, Any]:
    metrics = json.loads((out / "metrics.json").read_text())
    return {**{k: metrics[k] for k in COMPARED},
            "predictions": (out / "predictions" / "test.txt").read_text()}


def finished(out: Path, cache: Path, device: torch.device, steps: int,
             log: Path) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    with log.open("a") as err:
        subprocess.run(command(out, cache, device, steps), check=True, cwd=ROOT, stdout=err, stderr=err)
    return outcome(out), time.perf_counter() - started


def killed_at(out: Path, cache: Path, device: torch.device, steps: int, kill_at: int, log: Path) -> str:
    """Runs the command until its log reports update ``kill_at``, then SIGKILLs its whole
    process group; the last log line before the kill."""
    job = subprocess.Popen(command(out, cache, device, steps), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    last = ""
    assert job.stdout is not None
    with log.open("a") as copy:
        for line in job.stdout:
            copy.write(line)
            last = line.strip()
            if f"step {kill_at} |" in line:
                os.killpg(job.pid, signal.SIGKILL)
                break
    job.wait()
    if job.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the run ended (exit {job.returncode}) before update {kill_at}: {last}")
    return last


def torchrun_resume(device: torch.device, work: Path, *, steps: int, kill_at: int) -> dict[str, Any]:
    first, seconds = finished(work / "reference0", work / "cache0", device, steps, work / "reference0.log")
    second, _ = finished(work / "reference1", work / "cache1", device, steps, work / "reference1.log")
    last = killed_at(work / "killed", work / "cache2", device, steps, kill_at, work / "killed.log")
    checkpoints = sorted(p.name for p in (work / "killed" / "checkpoints").glob("*.pt"))
    resumed, _ = finished(work / "killed", work / "cache2", device, steps, work / "resumed.log")
    resumed_lines = [line for line in (work / "resumed.log").read_text().splitlines() if "resum" in line]

    def same(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"metrics_equal": all(a[k] == b[k] for k in COMPARED),
                "predictions_equal": a["predictions"] == b["predictions"],
                "exact_match": [a["exact_match"], b["exact_match"]],
                "token_accuracy": [a["token_accuracy"], b["token_accuracy"]]}

    references = same(first, second)
    recovered = same(first, resumed)
    result = {"command": " ".join(["torchrun --standalone --nproc_per_node 1 -m seqtrans run copy",
                                   f"--device {device.type} --set", *settings(steps)]),
              "process_group": "none: a world of one process joins none (NCCL needs two ranks, on two GPUs)",
              "reference_seconds": round(seconds, 1), "kill_at_update": kill_at,
              "last_line_before_kill": last,
              "checkpoints_at_kill": checkpoints, "resume_log": resumed_lines[-3:],
              "references_agree": references, "resumed_vs_reference": recovered}
    if not (recovered["metrics_equal"] and recovered["predictions_equal"]):
        if references["metrics_equal"] and references["predictions_equal"]:
            result["error"] = "the resumed run differs from two agreeing uninterrupted runs"
        else:
            result["note"] = "two uninterrupted runs on this device differ too: no exact comparison"
    return result
