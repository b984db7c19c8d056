"""A command's time on a quiet and on a busy machine, under each OpenMP wait policy and thread count.

Whether OpenMP threads spinning for cores that other processes hold are what slows
seqtrans down under load, and which policy should be the default.

The command runs ``--repeats`` times (the median counts) in every combination of:

- background load: none, then ``--load N`` CPU-burning processes beside it;
- wait policy (``--policies``): ``default`` (OpenMP's own: libgomp spins a few
  milliseconds, then sleeps), ``active`` (spin), ``passive`` (sleep at once) or a spin
  count, said to the command through ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``, which every
  OpenMP runtime in it reads when it loads (PyTorch's and CTranslate2's alike);
- threads (``--threads``): ``default`` (the command's own choice) or a count, said
  through ``SEQTRANS_THREADS`` and ``OMP_NUM_THREADS``.

    python -m benchmarks contention --load 2 -- seqtrans predict runs/m30k --src test.en
    python -m benchmarks contention --load 2 --policies default,passive --threads default \\
        -- python -m benchmarks decode_speed --cases base-beam4-b1 --no-peer --label ignored

A run past ``--timeout-s`` is stopped and recorded as timed out. Prints a table (each
time, and its slowdown under load) and writes JSON (``--out``, by default
benchmarks/results/contention-LABEL.json).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, arguments, background_load, policy_environment, write_results
from seqtrans.runtime.threads import parse_wait_policy


def time_command(command: list[str], env: dict[str, str], *, timeout: float) -> dict[str, Any]:
    """One run: its wall-clock seconds (None when it timed out) and exit status."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "timed_out": True, "returncode": None}
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(f"exit status {done.returncode}: {done.stderr.strip()[-500:]}", file=sys.stderr)
    return {"seconds": seconds, "timed_out": False, "returncode": done.returncode}


def combination(command: list[str], *, load: int, policy: str, threads: str, repeats: int,
                timeout: float) -> dict[str, Any]:
    """``repeats`` runs of one combination; the median of those that finished."""
    env = policy_environment(policy, threads)
    runs = [time_command(command, env, timeout=timeout) for _ in range(repeats)]
    finished = [r["seconds"] for r in runs if r["seconds"] is not None]
    row = {"background_load": load, "policy": policy, "threads": threads,
           "seconds": statistics.median(finished) if finished else None,
           "times": [r["seconds"] for r in runs], "timed_out": sum(r["timed_out"] for r in runs),
           "failed": sum(r["returncode"] not in (0, None) for r in runs)}
    print(f"load {load}, policy {policy}, threads {threads}: "
          + (f"{row['seconds']:.2f} s" if row["seconds"] is not None else "timed out"), flush=True)
    return row


def slowdowns(rows: list[dict[str, Any]], load: int) -> list[dict[str, Any]]:
    """Per policy and thread count: the time under ``load`` over the time on a quiet machine."""
    quiet = {(r["policy"], r["threads"]): r["seconds"] for r in rows if r["background_load"] == 0}
    out = []
    for r in rows:
        base = quiet.get((r["policy"], r["threads"]))
        if r["background_load"] == load and load and base and r["seconds"] is not None:
            out.append({"policy": r["policy"], "threads": r["threads"], "slowdown": r["seconds"] / base})
    return out


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--load", type=int, default=2, metavar="N",
                        help="CPU-burning processes beside the command in the busy runs (default 2).")
    parser.add_argument("--policies", default="default,active,passive,1000",
                        help="Comma-separated wait policies: default, active, passive or a spin count.")
    parser.add_argument("--threads", default="default,1",
                        help="Comma-separated thread counts: default (the command's own) or a number.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per combination (median).")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="A run's time limit.")
    parser.add_argument("--label", default="run", help="Write benchmarks/results/contention-LABEL.json.")
    parser.add_argument("--out", type=Path, help="Write the JSON here instead.")
    parser.add_argument("command", nargs="+", help="The command to time (after --).")
    args = parser.parse_args(argv)
    policies = [parse_wait_policy(p, name="--policies") for p in args.policies.split(",") if p]
    counts = [t.strip() for t in args.threads.split(",") if t.strip()]
    if any(t != "default" and not (t.isdigit() and int(t) > 0) for t in counts):
        parser.error(f"--threads: default or whole numbers, 1 or more, got {args.threads!r}")
    if args.load < 1 or args.repeats < 1:
        parser.error("--load and --repeats: 1 or more")
    rows = []
    for load in (0, args.load):
        with background_load(load):
            rows.extend(combination(args.command, load=load, policy=p, threads=t, repeats=args.repeats,
                                    timeout=args.timeout_s) for p in policies for t in counts)
    results = {"command": args.command, "load": args.load, "repeats": args.repeats,
               "timeout_s": args.timeout_s, "cpu_count": os.cpu_count(), "rows": rows,
               "slowdowns": slowdowns(rows, args.load)}
    print("| policy | threads | quiet s | loaded s | slowdown |\n|---|---|---|---|---|")
    for s in results["slowdowns"]:
        quiet = next(r["seconds"] for r in rows if r["background_load"] == 0 and r["policy"] == s["policy"]
                     and r["threads"] == s["threads"])
        print(f"| {s['policy']} | {s['threads']} | {quiet:.2f} | {quiet * s['slowdown']:.2f} | "
              f"{s['slowdown']:.2f} |")
    path = write_results(args.out or RESULTS / f"contention-{args.label}.json", results)
    print(f"wrote {path}")
