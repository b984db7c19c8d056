"""Encoder-decoder attention mechanisms on the copy task, after Britz et al. (2017), 4.1.

For every mechanism (memory attention with K in 1, 4, 16, 32, 64) and every maximum
length L, the copy task's small Transformer (its default preset: 2 + 2 layers, d_model
64, vocabulary 20) is trained for the same number of minutes with that
``model.cross_attention``; everything else is the same. Reported per configuration:

- exact match (and token accuracy) on 1,000 held-out sequences of length 1..L, decoded
  greedily as ``seqtrans run`` decodes the test split;
- the time to decode those 1,000 sequences greedily in one batch (outputs up to
  |x| + 5 tokens, the task's setting; the faster of two runs), and the part of it spent
  in the encoder-decoder attention (``prepare`` and every decoder step);
- a scaling run: the L = 200 models decode 200 sequences of exactly n tokens for
  n = 25 .. 200, each forced to write exactly n tokens (so every model does the same
  number of steps, however well it learned); the attention time is fitted by a line
  (and by a parabola) in |S|.

The training set has ``--train-size`` sequences, at most 4M tokens' worth (fewer
sequences at large L; a short budget never sees them all). ``--jobs 2`` trains and
times two configurations at a time, one torch thread each (one per core on a 2-core
machine): timings are then taken with the other core busy with the same kind of work.

Results go to benchmarks/results/attention_copy.json (rewritten after every
configuration, so an interrupted sweep continues where it stopped) and a plot to
benchmarks/results/attention_copy.png (needs the ``bench`` extra: matplotlib).

    python -m benchmarks attention_copy --minutes 3
    python -m benchmarks attention_copy --minutes 3 --lengths 50 --only scaled_dot monotonic
    python -m benchmarks attention_copy --minutes 1 --jobs 2 --skip memory-K4@200
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import seqtrans
from benchmarks.common import RESULTS, CrossAttentionClock, arguments, cpu_info, write_results
from seqtrans import pipeline
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import source_ids
from seqtrans.decoding import generate
from seqtrans.inference import loading
from seqtrans.model.transformer import Transformer
from seqtrans_copy import CopyConfig, CopyTask

LENGTHS = (10, 50, 100, 200)
SLOTS = (1, 4, 16, 32, 64)
SCALING = (25, 50, 75, 100, 125, 150, 175, 200)


def mechanisms(length: int) -> dict[str, list[str]]:
    """Config overrides of each mechanism measured."""
    out = {
        "scaled_dot": [],
        "dot": ["model.cross_attention=dot"],
        "general": ["model.cross_attention=general"],
        "additive": ["model.cross_attention=additive"],
        "location": ["model.cross_attention=location", f"model.location_max_length={length + 1}"],
        "local-p": ["model.cross_attention=local", "model.local_alignment=predictive"],
        "local-m": ["model.cross_attention=local", "model.local_alignment=monotonic"],
        "monotonic": ["model.cross_attention=monotonic"],
    }
    for k in SLOTS:
        out[f"memory-K{k}"] = ["model.cross_attention=memory", f"model.memory_slots={k}",
                               "model.memory_positions=true"]
    return out


def decode_timing(model: Transformer, sources: list[list[int]], *, exact: int = 0) -> dict[str, float]:
    """Greedy decoding of all ``sources`` in one batch, timed twice with the attention
    clock running; the faster run is reported. ``exact`` > 0 forces outputs of exactly
    that many tokens; otherwise up to |x| + 5, ending where the model writes the end symbol."""
    longest = max(len(s) for s in sources)
    config = DecodeConfig(beam=1, alpha=0.0, max_len_a=1.0, max_len_b=0 if exact else 5, min_len=exact,
                          batch_tokens=len(sources) * longest)
    device = torch.device("cpu")
    generate(model, sources[:8], config, device=device)  # warm-up
    runs = []
    for _ in range(2):
        clock = CrossAttentionClock(model)
        try:
            started = time.perf_counter()
            hyps = generate(model, sources, config, device=device)
            runs.append((time.perf_counter() - started, clock.seconds))
        finally:
            clock.close()
    total, attention = min(runs)
    lengths = [len(h[0].tokens) if h else 0 for h in hyps]
    return {"decode_seconds": total, "attention_seconds": attention, "attention_share": attention / total,
            "mean_output_length": float(np.mean(lengths))}


def train_size(length: int, args: argparse.Namespace) -> int:
    return min(args.train_size, 4_000_000 // length)


def run_config(name: str, overrides: list[str], length: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    out = Path(args.work) / f"{name}-L{length}"
    config = seqtrans.resolve_config("copy", overrides=[
        f"data.max_length={length}", f"data.train_size={train_size(length, args)}", "data.dev_size=500",
        f"data.test_size={args.test_size}", f"train.max_minutes={args.minutes}", "train.max_steps=1000000",
        "train.eval_every=1000", "train.valid_max_examples=200", f"seed={args.seed}", *overrides])
    if (out / "metrics.json").is_file():  # trained by an earlier, interrupted sweep
        metrics = json.loads((out / "metrics.json").read_text())
    else:
        metrics = pipeline.run(config, out, device="cpu")
    loaded = loading.load(out, device="cpu")
    task = CopyTask(config.data)
    sources = [source_ids(loaded.codec, e.source) for e in task.read("test")]
    timing = decode_timing(loaded.model, sources)
    return {"exact_match": metrics["exact_match"], "token_accuracy": metrics["token_accuracy"],
            "train_steps": metrics["train_steps"], "train_minutes": metrics["train_minutes"],
            "params": metrics["params"], **timing}


def scaling(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Decode 200 sequences of exactly n tokens with the L = 200 model, for each n, each
    forced to write exactly n tokens."""
    torch.set_num_threads(args.threads)
    loaded = loading.load(Path(args.work) / f"{name}-L200", device="cpu")
    points = []
    for n in SCALING:
        task = CopyTask(CopyConfig(min_length=n, max_length=n, test_size=200, seed=args.seed + 7))
        sources = [source_ids(loaded.codec, e.source) for e in task.read("test")]
        points.append({"length": n, **decode_timing(loaded.model, sources, exact=n)})
    lengths = np.array([p["length"] for p in points], dtype=float)
    attention = np.array([p["attention_seconds"] for p in points])
    slope, intercept = np.polyfit(lengths, attention, 1)
    fitted = slope * lengths + intercept
    r2 = 1 - ((attention - fitted) ** 2).sum() / ((attention - attention.mean()) ** 2).sum()
    quad = np.polyfit(lengths, attention, 2)
    decode = np.array([p["decode_seconds"] for p in points])
    decode_slope, decode_intercept = np.polyfit(lengths, decode, 1)
    return {"points": points,
            "decode_linear_fit": {"ms_per_source_token": decode_slope * 1e3,
                                  "intercept_ms": decode_intercept * 1e3},
            "linear_fit": {"ms_per_source_token": slope * 1e3, "intercept_ms": intercept * 1e3,
                           "r2": float(r2)},
            "quadratic_fit": {"a_ms": quad[0] * 1e3, "b_ms": quad[1] * 1e3, "c_ms": quad[2] * 1e3}}


def save(results: dict[str, Any], path: Path) -> None:
    write_results(path, results, sort_keys=False)


def table(results: dict[str, Any]) -> str:
    """Markdown tables: exact match, decoding time, attention time and speed-up over
    scaled_dot per mechanism and L, then the scaling fits."""
    per_mech = results["results"]
    lengths = sorted({int(L) for per in per_mech.values() for L in per})
    base = per_mech.get("scaled_dot", {})

    def grid(title: str, cell: Callable[[dict[str, Any], dict[str, Any] | None], str]) -> list[str]:
        lines = [f"| {title} | " + " | ".join(f"L={L}" for L in lengths) + " |",
                 "|---|" + "---:|" * len(lengths)]
        for name, per in per_mech.items():
            cells = [cell(per[str(L)], base.get(str(L))) if str(L) in per else "-" for L in lengths]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines + [""]

    lines = grid("exact match", lambda r, b: f"{r['exact_match']:.3f}")
    lines += grid("decode s (1,000 seq.)", lambda r, b: f"{r['decode_seconds']:.2f}")
    lines += grid("attention s", lambda r, b: f"{r['attention_seconds']:.2f}")
    lines += grid("speed-up over scaled_dot", lambda r, b: f"{b['decode_seconds'] / r['decode_seconds']:.2f}x"
                  if b else "-")
    if results.get("scaling"):
        lines += ["| L=200 model, exactly n tokens in and out | attention ms per source token (R²) "
                  "| x² term of a parabola, µs | decode ms per source token | attention s at n=200 "
                  "| decode s at n=200 |", "|---|---:|---:|---:|---:|---:|"]
        for name, sc in results["scaling"].items():
            fit, quad, last = sc["linear_fit"], sc["quadratic_fit"], sc["points"][-1]
            dec = sc.get("decode_linear_fit", {}).get("ms_per_source_token", float("nan"))
            lines.append(f"| {name} | {fit['ms_per_source_token']:.2f} ({fit['r2']:.3f}) "
                         f"| {quad['a_ms'] * 1e3:.2f} | {dec:.2f} | {last['attention_seconds']:.2f} "
                         f"| {last['decode_seconds']:.2f} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for name, per in results["results"].items():
        lengths = sorted(int(L) for L in per)
        style = "--" if name.startswith("memory") else "-"
        axes[0].plot(lengths, [per[str(L)]["exact_match"] for L in lengths], style, marker="o", label=name)
        axes[1].plot(lengths, [per[str(L)]["decode_seconds"] for L in lengths], style, marker="o", label=name)
    axes[0].set(xlabel="L (sequence lengths 1..L)", ylabel="exact match, 1,000 test sequences",
                title=f"copy task, {results['settings']['minutes']:g} min of training each")
    axes[1].set(xlabel="L", ylabel="seconds to decode the 1,000 (one batch, greedy)", yscale="log",
                title="inference time")
    for name, scale in results.get("scaling", {}).items():
        xs = [p["length"] for p in scale["points"]]
        ys = [p["attention_seconds"] for p in scale["points"]]
        fit, quad = scale["linear_fit"], scale["quadratic_fit"]
        line = axes[2].plot(xs, ys, "o", label=f"{name}: line {fit['ms_per_source_token']:.2f} ms/token "
                                             f"(R2 {fit['r2']:.3f}), x^2 term {quad['a_ms'] * 1e3:.2f} us")
        color = line[0].get_color()
        axes[2].plot(xs, [fit["intercept_ms"] / 1e3 + fit["ms_per_source_token"] / 1e3 * x for x in xs], "-",
                     color=color, alpha=0.5)
        axes[2].plot(xs, [(quad["a_ms"] * x * x + quad["b_ms"] * x + quad["c_ms"]) / 1e3 for x in xs], ":",
                     color=color, alpha=0.8)
    axes[2].set(xlabel="|S| = |T| (200 sequences of that length)",
                ylabel="seconds in encoder-decoder attention",
                title="attention time vs length (L=200 models)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def configurations(args: argparse.Namespace, results: dict[str, Any]) -> list[tuple[str, list[str], int]]:
    """Those still to run: L = 100 first (the comparison the targets name), then L = 200 (the
    scaling runs need its models), then the rest by L descending."""
    order = sorted(args.lengths, key=lambda L: (L != 100, L != 200, -L))
    todo = []
    for length in order:
        for name, overrides in mechanisms(length).items():
            if (args.only and name not in args.only) or f"{name}@{length}" in args.skip:
                continue
            if str(length) not in results["results"].get(name, {}):
                todo.append((name, overrides, length))
    return todo


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--minutes", type=float, default=3.0, help="Training budget per configuration.")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--only", nargs="+", help="Mechanism names to run (default: all).")
    parser.add_argument("--skip", nargs="+", default=[], help="Configurations NAME@L not to run.")
    parser.add_argument("--train-size", type=int, default=100_000,
                        help="Training sequences (at most 4M tokens' worth).")
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per configuration (1: robust to other processes on the machine).")
    parser.add_argument("--jobs", type=int, default=1, help="Configurations run at the same time.")
    parser.add_argument("--work", default="runs/attention_copy", help="Run directories (checkpoints).")
    parser.add_argument("--out", type=Path, default=RESULTS / "attention_copy.json")
    parser.add_argument("--scaling", nargs="*", default=["scaled_dot", "memory-K64", "monotonic"],
                        help="Mechanisms whose L=200 models get the scaling run.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"results": {}, "scaling": {}}
    if args.out.is_file():
        results = json.loads(args.out.read_text())
    results["settings"] = {"minutes": args.minutes, "train_size": args.train_size,
                           "train_tokens_max": 4_000_000, "test_size": args.test_size, "seed": args.seed,
                           "cpu": cpu_info()["model"], "threads": args.threads, "jobs": args.jobs,
                           "torch": torch.__version__, "preset": "copy default (2+2 layers, d_model 64)"}
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    # At most ``jobs`` tasks in flight; a scaling run goes first in the queue as soon as its
    # L = 200 model is trained, so an interrupted sweep still has it.
    queue: list[tuple[str, Any]] = [("config", c) for c in configurations(args, results)]
    queue += [("scaling", name) for name in args.scaling if name not in results["scaling"]
              and (Path(args.work) / f"{name}-L200" / "metrics.json").is_file()]
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        running: dict[concurrent.futures.Future[dict[str, Any]], tuple[str, Any]] = {}
        while queue or running:
            while queue and len(running) < args.jobs:
                kind, task = queue.pop(0)
                if kind == "config":
                    name, overrides, length = task
                    future = pool.submit(run_config, name, overrides, length, args)
                else:
                    future = pool.submit(scaling, task, args)
                running[future] = (kind, task)
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                kind, task = running.pop(future)
                if kind == "scaling":
                    results["scaling"][task] = future.result()
                    save(results, args.out)
                    fit = results["scaling"][task]["linear_fit"]
                    print(f"scaling {task}: {fit['ms_per_source_token']:.3f} ms per source token, "
                          f"R2 {fit['r2']:.4f}  [{time.perf_counter() - started:.0f}s]", flush=True)
                    continue
                name, _, length = task
                row = future.result()
                results["results"].setdefault(name, {})[str(length)] = row
                results["results"] = {k: results["results"][k] for k in mechanisms(max(LENGTHS))
                                      if k in results["results"]}  # a fixed row order
                save(results, args.out)
                print(f"{name:>12} L={length:<4} exact {row['exact_match']:.3f}  "
                      f"decode {row['decode_seconds']:.2f}s (attention {row['attention_share']:.0%})  "
                      f"{row['train_steps']} steps  [{time.perf_counter() - started:.0f}s]", flush=True)
                if length == 200 and name in args.scaling and name not in results["scaling"]:
                    queue.insert(0, ("scaling", name))
    print(table(results))
    try:
        plot(results, args.out.with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]): no plot")
