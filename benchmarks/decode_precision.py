"""Decoding speed of the ``decode.precision`` settings against fp32, on CPU, in one process.

The base-shape seqtrans model of ``decode_speed.py`` (random weights, exactly ``--out-len``
tokens per output) decodes the same batch in fp32, bf16 (autocast) and int8, the settings
taking turns in every round, so that a machine whose load changes slows them alike. Each
round gives a ratio to fp32 by wall-clock time and by the process's CPU time; the medians
are printed and written to benchmarks/results/decode_precision-cpu.json. With one thread
(``--threads 1``) the CPU-time ratio is the least disturbed by other processes.

    python -m benchmarks decode_precision                        # greedy b1 and beam 4 b32
    python -m benchmarks decode_precision --threads 1 --rounds 7
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from benchmarks.common import arguments, device_name, write_json
from benchmarks.decode_speed import CASES, SHAPES, seqtrans_decoder, sources

PRECISIONS = ("fp32", "bf16", "int8")


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--cases", nargs="+", default=["base-greedy-b1", "base-beam4-b32"],
                        help=f"Some of: {', '.join(c.name for c in CASES)}.")
    parser.add_argument("--out-len", type=int, default=16, help="Target tokens per output.")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds of every setting in turn.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads.")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    device = torch.device("cpu")
    print(f"device: {device_name(device)}")
    by_name = {c.name: c for c in CASES}
    rows: list[dict[str, Any]] = []
    for name in args.cases:
        case = by_name[name]
        src = sources(case.batch, SHAPES[case.shape]["vocab"])
        decoders = {p: seqtrans_decoder(case, device, src, args.out_len, precision=p) for p in PRECISIONS}
        for decode in decoders.values():
            decode()  # warm-up
        wall: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        cpu: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for _ in range(args.rounds):
            for p, decode in decoders.items():
                w, c = time.perf_counter(), time.process_time()
                decode()
                wall[p].append(time.perf_counter() - w)
                cpu[p].append(time.process_time() - c)
        tokens = case.batch * args.out_len
        row: dict[str, Any] = {"case": name, "out_len": args.out_len, "rounds": args.rounds}
        for p in PRECISIONS:
            row[f"{p}_tok_s"] = tokens / statistics.median(wall[p])
            if p != "fp32":
                row[f"{p}_of_fp32_wall"] = statistics.median(f / x for f, x in zip(wall["fp32"], wall[p]))
                row[f"{p}_of_fp32_cpu"] = statistics.median(f / x for f, x in zip(cpu["fp32"], cpu[p]))
        rows.append(row)
        print(f"{name:<18}" + "".join(f"  {p} {row[f'{p}_tok_s']:.1f} tok/s" for p in PRECISIONS)
              + "".join(f"  {p}/fp32 {row[f'{p}_of_fp32_wall']:.2f}x wall, {row[f'{p}_of_fp32_cpu']:.2f}x cpu"
                        for p in PRECISIONS[1:]), flush=True)
    path = write_json("decode_precision", {"rows": rows}, device)
    print(f"wrote {path}")
