"""How far a trained read policy's training matches its test-time decisions, per decoder
layer (:mod:`seqtrans.streaming.policy`): the share of selection probabilities within
[0.1, 0.9], the distance in source positions between where the hard decisions stop and
where the expected alignment stops on average, and the expected probability of the hard
stop, teacher-forced with a split's references.

    python benchmarks/policy_report.py RUN_DIR [--split dev] [--set decode.beam=1 ...]

Prints one JSON object per layer; a run whose encoder-decoder attention has no monotonic
policy prints nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from seqtrans.inference import loading
from seqtrans.streaming.policy import split_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run directory or checkpoint")
    parser.add_argument("--split", default="dev", help="the task's split to teacher-force (default dev)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = loading.load(args.run, overrides=args.set, device="cpu")
    for layer in split_report(loaded, args.split):
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in dataclasses.asdict(layer).items()}))


if __name__ == "__main__":
    main()
