"""How far a trained read policy's training matches its test-time decisions, per layer.

For each decoder layer of a trained run (:mod:`seqtrans.streaming.policy`): the share of
selection probabilities within [0.1, 0.9] and their histogram, the distance in source
positions between where the hard decisions stop and where the expected alignment stops on
average (unsigned and signed), the expected probability of the hard stop, and the share of
steps that select nothing, teacher-forced with a split's references, with hard decisions
at each stopping threshold of ``--thresholds`` (``decode.monotonic_threshold``).

    python -m benchmarks policy_report RUN_DIR [--split dev] [--thresholds 0.35 0.5 0.8] [--set ...]

Prints one JSON object per layer and threshold and writes them with the run's name and the split to
``benchmarks/results/policy_report-RUN.json`` (or ``--out``); a run whose encoder-decoder
attention has no monotonic policy has no layers to report: it writes nothing and exits
with status 1.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from benchmarks.common import RESULTS, arguments, write_results
from seqtrans.attention.monotonic import selecting
from seqtrans.inference import loading
from seqtrans.streaming.policy import split_report


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, tuple):
        return [round(v, 4) for v in value]
    return value


def main(argv: list[str]) -> int:
    parser = arguments(__doc__)
    parser.add_argument("run", type=Path, help="a run directory or checkpoint")
    parser.add_argument("--split", default="dev", help="the task's split to teacher-force (default dev)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5],
                        help="stopping thresholds of the hard decisions, each in (0, 1) (default 0.5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--out", type=Path, help="the results JSON (default benchmarks/results/"
                        "policy_report-RUN.json, RUN the run directory's name)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bad = [t for t in args.thresholds if not 0.0 < t < 1.0]
    if bad:
        parser.error(f"--thresholds: each must lie in (0, 1), got {', '.join(map(str, bad))}")
    loaded = loading.load(args.run, overrides=args.set, device="cpu")
    layers = []
    for threshold in args.thresholds:
        with selecting(threshold):
            for layer in split_report(loaded, args.split):
                fields = dataclasses.asdict(layer)
                layers.append({"threshold": threshold, **{k: _rounded(v) for k, v in fields.items()}})
    for layer in layers:
        print(json.dumps(layer))
    if not layers:
        print(f"{args.run}: no monotonic policy to report")
        return 1
    run = args.run.resolve()
    name = run.parent.parent.name if run.is_file() else run.name  # RUN/checkpoints/FILE.pt: RUN
    out = args.out or RESULTS / f"policy_report-{name}.json"
    write_results(out, {"benchmark": "policy_report", "run": name, "split": args.split,
                        "overrides": args.set, "layers": layers}, sort_keys=False)
    print(f"wrote {out}")
    return 0
