"""Encoder-decoder attention mechanisms on the copy task, after Britz et al. (2017), 4.1.

For every mechanism (memory attention with K in 1, 4, 16, 32, 64) and every maximum
length L, the copy task's small Transformer (its default preset: 2 + 2 layers, d_model
64, vocabulary 20) is trained for the same number of minutes with that
``model.cross_attention``; everything else is the same. Reported per configuration:

- exact match (and token accuracy) on 1,000 held-out sequences of length 1..L, decoded
  greedily as ``seqtrans run`` decodes the test split;
- the time to decode those 1,000 sequences in one batch (the best of two runs), and the
  part of it spent in the encoder-decoder attention (``prepare`` and every decoder step);
- a scaling run: the L = 200 models decode 200 sequences of exactly n tokens for
  n = 25 .. 200; the attention time is fitted by a line (and scaled_dot's also by a
  parabola) in |S|.

Results go to benchmarks/results/attention_copy.json (rewritten after every
configuration, so an interrupted sweep continues where it stopped) and a plot to
benchmarks/results/attention_copy.png (needs the ``bench`` extra: matplotlib).

    python benchmarks/attention_copy.py --minutes 3
    python benchmarks/attention_copy.py --minutes 3 --lengths 50 --only scaled_dot monotonic
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqtrans import pipeline
from seqtrans.config import DecodeConfig
from seqtrans.decoding import generate
from seqtrans.model import Transformer
from seqtrans.vocab import EOS
from seqtrans_copy import CopyConfig, CopyTask

RESULTS = Path(__file__).resolve().parent / "results"
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


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class AttentionClock:
    """Wall time spent in every decoder layer's encoder-decoder attention (prepare and steps)."""

    def __init__(self, model: Transformer) -> None:
        self.seconds = 0.0
        self.handles: list[Any] = []
        self.restore: list[tuple[Any, Callable[..., Any]]] = []
        for layer in model.decoder_layers:
            attn: Any = layer.cross_attn
            self.handles.append(attn.register_forward_pre_hook(self._start))
            self.handles.append(attn.register_forward_hook(self._stop))
            prepare = attn.prepare
            self.restore.append((attn, prepare))
            attn.prepare = self._timed(prepare)
        self._started = 0.0

    def _start(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._started

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return wrapper

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        for attn, prepare in self.restore:
            attn.prepare = prepare


def decode_timing(model: Transformer, sources: list[list[int]]) -> dict[str, float]:
    """Greedy decoding of all ``sources`` in one batch: the best of two runs, and the
    attention's share measured in a third."""
    longest = max(len(s) for s in sources)
    config = DecodeConfig(beam=1, alpha=0.0, max_len_a=1.0, max_len_b=5,
                          batch_tokens=len(sources) * longest)
    device = torch.device("cpu")
    generate(model, sources[:8], config, device=device)  # warm-up
    runs = []
    for _ in range(2):
        started = time.perf_counter()
        generate(model, sources, config, device=device)
        runs.append(time.perf_counter() - started)
    clock = AttentionClock(model)
    try:
        started = time.perf_counter()
        generate(model, sources, config, device=device)
        total = time.perf_counter() - started
    finally:
        clock.close()
    return {"decode_seconds": min(runs), "attention_seconds": clock.seconds,
            "attention_share": clock.seconds / total}


def run_config(name: str, overrides: list[str], length: int, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.work) / f"{name}-L{length}"
    config = pipeline.resolve_config("copy", overrides=[
        f"data.max_length={length}", f"data.train_size={args.train_size}", "data.dev_size=500",
        f"data.test_size={args.test_size}", f"train.max_minutes={args.minutes}", "train.max_steps=1000000",
        "train.eval_every=1000", "train.valid_max_examples=200", f"seed={args.seed}", *overrides])
    if (out / "metrics.json").is_file():  # trained by an earlier, interrupted sweep
        metrics = json.loads((out / "metrics.json").read_text())
    else:
        metrics = pipeline.run(config, out, device="cpu")
    loaded = pipeline.load(out, device="cpu")
    task = CopyTask(config.data)
    sources = [loaded.vocabs.source.encode(task.source_tokens(e.source)) + [EOS] for e in task.read("test")]
    timing = decode_timing(loaded.model, sources)
    return {"exact_match": metrics["exact_match"], "token_accuracy": metrics["token_accuracy"],
            "train_steps": metrics["train_steps"], "train_minutes": metrics["train_minutes"],
            "params": metrics["params"], **timing}


def scaling(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Decode 200 sequences of exactly n tokens with the L = 200 model, for each n."""
    loaded = pipeline.load(Path(args.work) / f"{name}-L200", device="cpu")
    points = []
    for n in SCALING:
        task = CopyTask(CopyConfig(min_length=n, max_length=n, test_size=200, seed=args.seed + 7))
        sources = [loaded.vocabs.source.encode(task.source_tokens(e.source)) + [EOS]
                   for e in task.read("test")]
        points.append({"length": n, **decode_timing(loaded.model, sources)})
    lengths = np.array([p["length"] for p in points], dtype=float)
    attention = np.array([p["attention_seconds"] for p in points])
    slope, intercept = np.polyfit(lengths, attention, 1)
    fitted = slope * lengths + intercept
    r2 = 1 - ((attention - fitted) ** 2).sum() / ((attention - attention.mean()) ** 2).sum()
    quad = np.polyfit(lengths, attention, 2)
    return {"points": points,
            "linear_fit": {"ms_per_source_token": slope * 1e3, "intercept_ms": intercept * 1e3,
                           "r2": float(r2)},
            "quadratic_fit": {"a_ms": quad[0] * 1e3, "b_ms": quad[1] * 1e3, "c_ms": quad[2] * 1e3}}


def save(results: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, path)


def table(results: dict[str, Any]) -> str:
    lengths = sorted({int(L) for per in results["results"].values() for L in per})
    head = "| mechanism | " + " | ".join(f"L={L} exact / decode s" for L in lengths) + " |"
    lines = [head, "|---|" + "---|" * len(lengths)]
    for name, per in results["results"].items():
        cells = []
        for L in lengths:
            r = per.get(str(L))
            cells.append(f"{r['exact_match']:.3f} / {r['decode_seconds']:.2f}" if r else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    base = results["results"].get("scaled_dot", {})
    if base:
        lines += ["", "| mechanism | " + " | ".join(f"L={L} speed-up" for L in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for name, per in results["results"].items():
            cells = []
            for L in lengths:
                r, b = per.get(str(L)), base.get(str(L))
                cells.append(f"{b['decode_seconds'] / r['decode_seconds']:.2f}x" if r and b else "-")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="Training budget per configuration.")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--only", nargs="+", help="Mechanism names to run (default: all).")
    parser.add_argument("--train-size", type=int, default=100_000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: robust to other processes on the machine).")
    parser.add_argument("--work", default="runs/attention_copy", help="Run directories (checkpoints).")
    parser.add_argument("--out", type=Path, default=RESULTS / "attention_copy.json")
    parser.add_argument("--scaling", nargs="*", default=["scaled_dot", "memory-K64", "monotonic"],
                        help="Mechanisms whose L=200 models get the scaling run.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"results": {}, "scaling": {}}
    if args.out.is_file():
        results = json.loads(args.out.read_text())
    results["settings"] = {"minutes": args.minutes, "train_size": args.train_size,
                           "test_size": args.test_size, "seed": args.seed, "cpu": cpu_name(),
                           "threads": torch.get_num_threads(),
                           "torch": torch.__version__, "preset": "copy default (2+2 layers, d_model 64)"}
    for length in args.lengths:
        for name, overrides in mechanisms(length).items():
            if args.only and name not in args.only:
                continue
            if str(length) in results["results"].get(name, {}):
                continue
            started = time.perf_counter()
            row = run_config(name, overrides, length, args)
            results["results"].setdefault(name, {})[str(length)] = row
            save(results, args.out)
            print(f"{name:>12} L={length:<4} exact {row['exact_match']:.3f}  "
                  f"decode {row['decode_seconds']:.2f}s (attention {row['attention_share']:.0%})  "
                  f"{row['train_steps']} steps  "
                  f"[{time.perf_counter() - started:.0f}s]", flush=True)
    for name in args.scaling:
        if (Path(args.work) / f"{name}-L200" / "metrics.json").is_file() and name not in results["scaling"]:
            results["scaling"][name] = scaling(name, args)
            save(results, args.out)
            fit = results["scaling"][name]["linear_fit"]
            print(f"scaling {name}: {fit['ms_per_source_token']:.3f} ms per source token, R2 {fit['r2']:.4f}")
    print(table(results))
    try:
        plot(results, args.out.with_suffix(".png"))
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]): no plot")


if __name__ == "__main__":
    main()
