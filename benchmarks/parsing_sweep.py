"""Parsing settings compared over several seeds, each run a fixed number of updates.

Runs of ``seqtrans run parsing`` with a fixed number of updates, several at once on one
device, and a table of test F1 (mean, standard deviation, each seed) and greedy dev F1
over training.

A fixed number of updates, not a time budget, makes runs that share a device
comparable: 3,850 updates is what the ``cpu`` preset reaches in its 30 minutes on a
2-core CPU. Each setting is ``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` (``--set`` keys of
``seqtrans run``). Writes ``benchmarks/results/parsing_sweep-TAG.json``.

    python -m benchmarks parsing_sweep --device cuda --jobs 12 --seeds 1 2 3 \\
        --setting preset --setting sub2:data.substitute=1 --tag sub2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, arguments, write_results


def parse_setting(text: str) -> tuple[str, list[str]]:
    name, _, rest = text.partition(":")
    return name, [kv for kv in rest.split(",") if kv]


def one_run(name: str, overrides: list[str], seed: int, args: argparse.Namespace) -> dict[str, Any]:
    run = args.out / f"{name}-seed{seed}"
    command = [sys.executable, "-m", "seqtrans", "run", "parsing", "--preset", args.preset,
               "--out", str(run), "--device", args.device, "--set", "train.max_minutes=0",
               f"train.max_steps={args.steps}", f"seed={seed}",
               f"decode.compare_unconstrained={str(args.unconstrained).lower()}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    minutes = round((time.perf_counter() - start) / 60, 2)
    result: dict[str, Any] = {"setting": name, "seed": seed, "minutes": minutes}
    if done.returncode != 0:
        result["error"] = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return result
    metrics = json.loads((run / "metrics.json").read_text())
    dev = [(e["step"], e["dev_f1"]) for e in map(json.loads, (run / "train.jsonl").read_text().splitlines())
           if e.get("event") == "validation"]
    result.update({key: metrics[key] for key in ("f1", "recall", "precision", "complete_match", "f1_len40",
                                                 "tag_accuracy", "train_steps") if key in metrics})
    if args.unconstrained:
        result["unconstrained_f1"] = metrics.get("unconstrained_f1")
    result["dev_f1"] = dev
    print(f"{name} seed {seed}: test F1 {result['f1']:.2f}, greedy dev F1 "
          + " / ".join(f"{f:.1f}" for _, f in dev) + f" ({result['minutes']} min)", flush=True)
    return result


def main(argv: list[str]) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--setting", action="append", required=True,
                        help="NAME or NAME:KEY=VALUE,KEY=VALUE (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=3850,
                        help="Updates per run (about the cpu preset's 30 minutes).")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--jobs", type=int, default=1, help="Runs at once.")
    parser.add_argument("--threads", type=int, default=1, help="Torch threads per run.")
    parser.add_argument("--unconstrained", action="store_true", help="Also decode without the constraint.")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--tag", default="sweep")
    args = parser.parse_args(argv)
    settings = [parse_setting(s) for s in args.setting]
    jobs = [(name, overrides, seed) for seed in args.seeds for name, overrides in settings]
    start = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(lambda job: one_run(*job, args), jobs))
    summary: dict[str, Any] = {}
    print(f"\n{'setting':<24} {'test F1 mean':>12} {'sd':>5}  seeds")
    for name, overrides in settings:
        f1 = [r["f1"] for r in runs if r["setting"] == name and "f1" in r]
        summary[name] = {"overrides": overrides, "f1": f1,
                         "mean": round(statistics.mean(f1), 2) if f1 else None,
                         "sd": round(statistics.stdev(f1), 2) if len(f1) > 1 else None}
        s = summary[name]
        print(f"{name:<24} {s['mean'] if f1 else float('nan'):>12} {s['sd'] or 0:>5}  "
              + " ".join(f"{x:.2f}" for x in f1))
    failed = [r for r in runs if "error" in r]
    for r in failed:
        print(f"FAILED {r['setting']} seed {r['seed']}: {r['error']}")
    import torch

    cpu = platform.processor() or platform.machine()
    device = torch.cuda.get_device_name() if args.device == "cuda" else cpu
    result = {"steps": args.steps, "preset": args.preset, "seeds": args.seeds, "device": device,
              "jobs": args.jobs, "wall_minutes": round((time.perf_counter() - start) / 60, 2),
              "summary": summary, "runs": runs}
    out = RESULTS / f"parsing_sweep-{args.tag}.json"
    write_results(out, result, sort_keys=False)
    print(f"wrote {out.relative_to(ROOT)}")
    return 1 if failed else 0
