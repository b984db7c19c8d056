"""Beam search speed of other checkouts of seqtrans, side by side in one run.

Which change made decoding slower or faster: the steps of a bisection, measured at once.

    git archive COMMIT seqtrans benchmarks | tar -x -C trees/COMMIT     # one per commit
    python -m benchmarks decode_trees trees/* --device cuda --cases base-beam4-b32 --sync-trace

Each tree is timed by its own ``benchmarks/decode_speed.py`` (its ``Case``, ``sources``,
``seqtrans_model`` and ``seqtrans_decoder``, whose signatures every version since
2026-11-22 shares), in a process of its own started in the tree, so that it imports that
tree's seqtrans. The trees are timed in turns, ``--rounds`` times, so that a drift in the
machine's speed falls on all of them alike; each tree's figure is its median. On CUDA,
``--sync-trace`` also records where each tree's decoding waits for the device
(``torch.cuda.set_sync_debug_mode``): the places in its code, with how often each waited
in one decode. Writes ``benchmarks/results/decode_trees-DEVICE.json`` (or ``--out``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS, arguments, device_name, pick_device, write_results

# Runs in the tree (its working directory first on the import path): that tree's seqtrans and
# decode_speed. Prints one JSON line.
CHILD = r"""
import importlib.util, inspect, json, sys, time, warnings
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("tree_decode_speed", Path("benchmarks/decode_speed.py"))
mod = importlib.util.module_from_spec(spec)
sys.modules["tree_decode_speed"] = mod
spec.loader.exec_module(mod)
a = json.loads(sys.argv[1])
device = torch.device(a["device"])
shape, beam, batch = a["case"]
case = mod.Case(shape, beam, batch)
src = mod.sources(batch, mod.SHAPES[shape]["vocab"]).to(device)
named = inspect.signature(mod.seqtrans_decoder).parameters
out = {"case": case.name}

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()

for precision in a["precisions"]:
    if precision == "fp32":
        extra = {}
    elif "precision" in named:
        extra = {"precision": precision}
    elif precision == "bf16" and "bf16" in named:
        extra = {"bf16": True}
    else:
        out[precision + "_tok_s"] = None
        continue
    with torch.no_grad():
        decode = mod.seqtrans_decoder(case, device, src, a["out_len"], **extra)
        decode()
        sync()
        times = []
        for _ in range(a["repeats"]):
            start = time.perf_counter()
            decode()
            sync()
            times.append(time.perf_counter() - start)
        out[precision + "_tok_s"] = batch * a["out_len"] / sorted(times)[len(times) // 2]
        if a["sync_trace"] and device.type == "cuda" and precision == "fp32":
            places = {}
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                decode()
            torch.cuda.set_sync_debug_mode("default")
            for w in caught:
                if "synchroniz" in str(w.message):
                    where = f"{Path(w.filename).resolve().relative_to(Path.cwd().resolve())}:{w.lineno}" \
                        if Path(w.filename).resolve().is_relative_to(Path.cwd().resolve()) \
                        else f"{Path(w.filename).name}:{w.lineno}"
                    places[where] = places.get(where, 0) + 1
            out["syncs_per_decode"] = dict(sorted(places.items(), key=lambda p: -p[1]))
print(json.dumps(out))
"""


def time_tree(tree: Path, case: tuple[str, int, int], args: Any, device: torch.device, *,
              trace: bool) -> dict[str, Any]:
    settings = {"device": device.type, "case": list(case), "out_len": args.out_len, "repeats": args.repeats,
                "precisions": args.precisions, "sync_trace": trace}
    # 'python -c' puts its working directory, the tree, first on the import path (unless
    # PYTHONSAFEPATH): the tree's seqtrans before any other on the path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=args.timeout_s)
    if done.returncode != 0:
        return {"case": case, "error": done.stderr.strip()[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_case(name: str) -> tuple[str, int, int]:
    """``base-beam4-b32`` -> ("base", 4, 32); ``base-greedy-b1`` -> ("base", 1, 1)."""
    shape, mode, batch = name.rsplit("-", 2)
    beam = 1 if mode == "greedy" else int(mode.removeprefix("beam"))
    return shape, beam, int(batch.removeprefix("b"))


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("trees", nargs="+", type=Path, help="Checkouts (seqtrans/ and benchmarks/ in each).")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=["base-beam4-b32"],
                        help="decode_speed's case names, e.g. base-beam4-b32 base-greedy-b1.")
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16", "int8"],
                        help="int8: on a CPU, in trees whose decoder takes a precision.")
    parser.add_argument("--out-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="Timed decodes per tree and round (median).")
    parser.add_argument("--rounds", type=int, default=2, help="Turns over all the trees.")
    parser.add_argument("--sync-trace", action="store_true",
                        help="On CUDA: where each tree's decoding waits for the device.")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="Per tree and round.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    for tree in args.trees:
        if not (tree / "benchmarks" / "decode_speed.py").is_file() or not (tree / "seqtrans").is_dir():
            parser.error(f"{tree}: no seqtrans/ and benchmarks/decode_speed.py in it")
    rows = []
    for name in args.cases:
        case = parse_case(name)
        runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in args.trees}
        for turn in range(args.rounds):
            for tree in args.trees:
                result = time_tree(tree, case, args, device, trace=args.sync_trace and turn == 0)
                runs[str(tree)].append(result)
                print(json.dumps({"tree": tree.name or "working tree", "round": turn, **result}), flush=True)
        for tree in args.trees:
            done = runs[str(tree)]
            row: dict[str, Any] = {"tree": tree.name or "working tree", "case": name, "rounds": done}
            for precision in args.precisions:
                values = [r[precision + "_tok_s"] for r in done if r.get(precision + "_tok_s")]
                row[precision + "_tok_s"] = statistics.median(values) if values else None
            rows.append(row)
    results = {"device": device_name(device), "torch": torch.__version__, "cases": args.cases,
               "out_len": args.out_len, "repeats": args.repeats, "rounds": args.rounds, "rows": rows}
    out = args.out or RESULTS / f"decode_trees-{device.type}.json"
    write_results(out, results, sort_keys=False)
    for row in rows:
        speeds = [f"{p} {row[p + '_tok_s']:,.0f} tok/s" if row[p + "_tok_s"] else f"{p} -"
                  for p in args.precisions]
        print(f"{row['case']:18s} {row['tree']:24s} " + " ".join(speeds))
    print(f"wrote {out}")
