"""``seqtrans predict`` with freed memory kept for reuse against the C library's own policy.

Freed memory kept for reuse is the default; the C library's own policy is
``SEQTRANS_MALLOC=system``. Whole processes, in turn.

    python -m benchmarks freed_memory RUN --input test.en --set decode.precision=int8 [--runs 5]

Each run is ``seqtrans --threads N predict RUN --set ...`` reading ``--input`` on stdin,
so each wall time includes starting Python, importing torch and loading the model; the two
policies alternate (system, keep, system, keep, ...) so that a drift of the machine's speed
falls on both. Records each run's seconds, the medians, the ratio of the medians, and
whether the two policies wrote the same outputs (they must: the policy changes where
memory comes from, not what is computed). Writes ``benchmarks/results/freed_memory.json``
(or ``--out``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, arguments, write_results

POLICIES = ("system", "keep")


def predict(run: Path, source: bytes, policy: str, *, threads: int,
            overrides: list[str]) -> tuple[float, bytes]:
    """Seconds of one ``seqtrans predict`` process under ``policy``, and what it wrote."""
    env = {**os.environ, "SEQTRANS_MALLOC": policy}
    command = [sys.executable, "-m", "seqtrans", "--threads", str(threads), "-q", "predict", str(run)]
    if overrides:
        command += ["--set", *overrides]
    started = time.perf_counter()
    done = subprocess.run(command, input=source, capture_output=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return seconds, done.stdout


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("run", type=Path, help="The run directory to decode with.")
    parser.add_argument("--input", type=Path, required=True, help="The sentences to translate, one per line.")
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Decoding settings, as predict's --set.")
    parser.add_argument("--threads", type=int, default=1, help="seqtrans --threads (default 1).")
    parser.add_argument("--runs", type=int, default=5, help="Runs of each policy, after one warm-up each.")
    parser.add_argument("--out", type=Path, default=RESULTS / "freed_memory.json")
    args = parser.parse_args(argv)
    source = args.input.read_bytes()
    outputs: dict[str, bytes] = {}
    for policy in POLICIES:  # warm-up: the native kernels' build, the page cache
        outputs[policy] = predict(args.run, source, policy, threads=args.threads, overrides=args.overrides)[1]
    seconds: dict[str, list[float]] = {p: [] for p in POLICIES}
    for _ in range(args.runs):
        for policy in POLICIES:
            took, out = predict(args.run, source, policy, threads=args.threads, overrides=args.overrides)
            seconds[policy].append(round(took, 3))
            if out != outputs[policy]:
                raise SystemExit(f"{policy}: the outputs changed between runs")
    median = {p: statistics.median(s) for p, s in seconds.items()}
    results = {"benchmark": "freed_memory", "run": args.run.name, "input": args.input.name,
               "sentences": source.count(b"\n"), "overrides": args.overrides, "threads": args.threads,
               "seconds": seconds, "median_seconds": median,
               "system_over_keep": round(median["system"] / median["keep"], 3),
               "same_outputs": outputs["system"] == outputs["keep"]}
    print(results)
    write_results(args.out, results)
    print(f"wrote {args.out}")
