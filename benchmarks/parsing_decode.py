"""Parsing decoding speed: sentences per second of constrained beam search at several batch sizes.

Beam search with the bracket constraint, for a trained parsing run.

Decodes the first ``--sentences`` test sentences with the run's decoding settings (beam
21, alpha 0.3, maximum length input + 300, the constraint), sorted by length and cut into
batches of each ``--batch-sizes`` sentences, as ``generate`` does; ``tokens`` decodes with
the run's ``decode.batch_tokens`` instead, as ``seqtrans run`` does. With ``--baseline REV``
the code of git revision REV (its ``seqtrans`` package and parsing plugin) and this
checkout's are timed on the same sentences in fresh processes that
alternate, so that a busier moment of the machine hits both, and the outputs and scores
of both are compared.

Prints sentences/s per batch size (median of ``--repeats``) and writes
``benchmarks/results/parsing_decode-DEVICE.json`` (``--tag`` adds a suffix).

    python -m benchmarks parsing_decode RUN_DIR [--trees FILE] [--sentences 30]
        [--batch-sizes 1 4 16 64 tokens] [--repeats 3] [--baseline main] [--profile]
        [--set decode.precision=int8] [--int8]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import ROOT, arguments, device_name, timed_once, write_json
from seqtrans.data.batches import pad_batch, source_ids
from seqtrans.decoding.beam import beam_search
from seqtrans.decoding.generate import length_batches, max_output_length
from seqtrans.decoding.search import Hypothesis

try:  # this engine
    from seqtrans.inference.evaluation import read_split
    from seqtrans.inference.loading import Loaded, load
except ImportError:  # an engine from before the inference package (--baseline)
    from seqtrans.pipeline import Loaded, load, read_split  # type: ignore[attr-defined,no-redef]



def engine_tree(rev: str) -> Path:
    """The ``seqtrans`` package and the parsing plugin of git revision ``rev``, extracted
    into a temporary directory."""
    tree = Path(tempfile.mkdtemp(prefix="parsing-decode-"))
    paths = ["seqtrans", "plugins/parsing/seqtrans_parsing"]
    archive = subprocess.run(["git", "archive", rev, *paths], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def batches(lengths: list[int], size: str, batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length in groups of ``size`` sentences, or by ``batch_tokens``."""
    if size == "tokens":
        return list(length_batches(lengths, batch_tokens))
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = int(size)
    return [order[i : i + n] for i in range(0, len(order), n)]


def _decoding_model(run: Loaded) -> Any:
    """The model ``generate`` decodes with for the run's ``decode.precision``, in this
    engine or (``--baseline``) an older one."""
    try:
        from seqtrans.decoding.generate import decoding_model
    except ImportError:  # before decoding_model: int8 had its copy, fp32 the model itself
        from seqtrans.linear.quantize import quantized_cached

        return quantized_cached(run.model) if run.config.decode.precision == "int8" else run.model
    return decoding_model(run.model, run.config.decode.precision, run.device)


def decode(run: Loaded, sources: list[Any], ids: list[list[int]],
           groups: list[list[int]]) -> list[list[Hypothesis]]:
    """What ``generate`` does for these groups, with the model it decodes with for the
    run's ``decode.precision`` (the int8 copy; the oneDNN copy for fp32 on a CPU)."""
    d = run.config.decode
    out: list[list[Hypothesis]] = [[] for _ in ids]
    codec: Any = run.codec
    model = _decoding_model(run)
    for idx in groups:
        src = pad_batch([ids[i] for i in idx]).to(run.device)
        max_len = torch.tensor([max_output_length(len(ids[i]) - 1, d) for i in idx])
        constraint = codec.constraint([sources[i] for i in idx]) if d.constrained else None
        hyps = beam_search(model, src, beam=d.beam, alpha=d.alpha, max_len=max_len, min_len=d.min_len,
                      nbest=d.nbest, constraint=constraint)
        for i, h in zip(idx, hyps):
            out[i] = h
    return out


def digest(outputs: list[list[Hypothesis]]) -> str:
    """What two engines must agree on: every hypothesis's tokens, log-probability and score."""
    text = repr([[(h.tokens, h.log_prob, h.score) for h in hyps] for hyps in outputs])
    return hashlib.sha256(text.encode()).hexdigest()


def in_process(loaded: tuple[Loaded, list[Any], list[list[int]]], size: str) -> dict[str, Any]:
    """Time decoding the sentences in batches of ``size`` in this process."""
    run, sources, ids = loaded
    groups = batches([len(i) for i in ids], size, run.config.decode.batch_tokens)
    took, outputs = timed_once(lambda: decode(run, sources, ids, groups))
    tokens = hashlib.sha256(repr([[h.tokens for h in hyps] for hyps in outputs]).encode()).hexdigest()
    return {"seconds": took, "digest": digest(outputs), "tokens": tokens, "batches": len(groups)}


def in_subprocess(args: argparse.Namespace, size: str, engine: Path) -> dict[str, Any]:
    """:func:`in_process` in a fresh process that imports ``seqtrans`` and the parsing
    plugin from ``engine``."""
    command = [sys.executable, "-m", "benchmarks", "parsing_decode", str(Path(args.run).resolve()),
               "--worker", size, "--sentences", str(args.sentences),
               *(["--trees", str(Path(args.trees).resolve())] if args.trees else []),
               *(["--set", *args.set] if args.set else [])]
    # the engine's seqtrans before this checkout's; the benchmarks from this checkout, and the
    # engine's directory as the working one, so that ``-m`` puts no other seqtrans first
    path = [str(engine), str(engine / "plugins" / "parsing"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(command, env=env, cwd=engine, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def prepare(args: argparse.Namespace) -> tuple[Loaded, list[Any], list[list[int]]]:
    overrides = [*args.set, *([f"data.test={args.trees}"] if args.trees else [])]
    run = load(args.run, overrides=overrides, device="cpu")
    examples = read_split(run.task, "test").examples[: args.sentences]
    sources = [ex.source for ex in examples]
    return run, sources, [source_ids(run.codec, s) for s in sources]


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("run", type=Path, help="A parsing run directory (or checkpoint).")
    parser.add_argument("--trees", default="", help="Test trees to decode (default: the run's test split).")
    parser.add_argument("--sentences", type=int, default=30, help="Decode the first N test sentences.")
    parser.add_argument("--batch-sizes", nargs="+", default=["1", "4", "16", "64", "tokens"],
                        help="Sentences per batch; 'tokens': the run's decode.batch_tokens.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs per batch size (median).")
    parser.add_argument("--baseline", default="", help="Also time the engine of this git revision.")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="Override decode.* keys.")
    parser.add_argument("--profile", action="store_true", help="Print a cProfile of one run per batch size.")
    parser.add_argument("--int8", action="store_true",
                        help="Also time decode.precision=int8 in this process, alternating with the "
                        "run's own.")
    parser.add_argument("--tag", default="", help="Suffix of the JSON file's name.")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one timing, printed as JSON
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.worker:
        print(json.dumps(in_process(prepare(args), args.worker)))
        return
    loaded = prepare(args)
    run, sources, ids = loaded
    engines = {"current": ROOT}
    if args.baseline:
        engines = {"baseline": engine_tree(args.baseline), **engines}
    if args.int8 and args.baseline:
        parser.error("--int8 and --baseline are separate comparisons; run them one at a time")
    int8 = dataclasses.replace(run, config=dataclasses.replace(
        run.config, decode=dataclasses.replace(run.config.decode, precision="int8")))
    if args.int8:
        engines["int8"] = ROOT
    d = run.config.decode
    print(f"{device_name(run.device)}; {len(sources)} sentences, {sum(len(i) - 1 for i in ids)} source "
          f"tokens; beam {d.beam}, alpha {d.alpha}, constrained {d.constrained}")
    rows = []
    for size in args.batch_sizes:
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        digests: dict[str, str] = {}
        tokens: dict[str, str] = {}
        row: dict[str, Any] = {"batch": size}
        for _ in range(args.repeats):  # alternating, so that a busier moment hits both
            for name, engine in engines.items():
                if args.baseline:
                    timing = in_subprocess(args, size, engine)
                else:
                    timing = in_process((int8, sources, ids) if name == "int8" else loaded, size)
                seconds[name].append(timing["seconds"])
                digests[name] = timing["digest"]
                tokens[name] = timing["tokens"]
                row["batches"] = timing["batches"]
        for name in engines:
            row[f"{name}_sent_s"] = len(sources) / statistics.median(seconds[name])
            row[f"{name}_seconds"] = seconds[name]
        line = f"batch {size:>6}: " + ", ".join(f"{n} {row[f'{n}_sent_s']:6.2f} sent/s" for n in engines)
        if args.baseline:
            row["identical"] = digests["baseline"] == digests["current"]
            row["tokens_identical"] = tokens["baseline"] == tokens["current"]
            row["speedup"] = row["current_sent_s"] / row["baseline_sent_s"]
            same = ("outputs and scores identical" if row["identical"] else
                    "outputs identical, scores differ" if row["tokens_identical"] else "outputs DIFFER")
            line += f", x{row['speedup']:.2f}, {same}"
        if args.int8:
            row["int8_speedup"] = row["int8_sent_s"] / row["current_sent_s"]
            row["int8_identical"] = digests["int8"] == digests["current"]
            line += f", int8 x{row['int8_speedup']:.2f}"
        print(line, flush=True)
        rows.append(row)
        if args.profile:
            groups = batches([len(i) for i in ids], size, d.batch_tokens)
            profiler = cProfile.Profile()
            profiler.runcall(decode, run, sources, ids, groups)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue())
    name = "parsing_decode" + (f"-{args.tag}" if args.tag else "")
    # the run's name only: results name no machine paths
    path = write_json(name, {"run": args.run.name, "sentences": len(sources), "beam": d.beam,
                             "alpha": d.alpha, "constrained": d.constrained, "precision": d.precision,
                             "baseline": args.baseline,
                             "rows": rows}, run.device)
    print(f"wrote {path}")
