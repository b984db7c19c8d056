"""Parsing decoding speed: sentences per second of beam search with the bracket constraint
at several batch sizes, for a trained parsing run.

Decodes the first ``--sentences`` test sentences with the run's decoding settings (beam
21, alpha 0.3, maximum length input + 300, the constraint), sorted by length and cut into
batches of each ``--batch-sizes`` sentences, as ``generate`` does; ``tokens`` decodes with
the run's ``decode.batch_tokens`` instead, as ``seqtrans run`` does. With ``--baseline REV``
the beam search of git revision REV (``seqtrans/decoding/beam.py`` there, with the engine
and constraint of this checkout) is timed in the same process on the same sentences,
alternating with this one, and the outputs and scores of both are compared.

Prints sentences/s per batch size (median of ``--repeats``) and writes
``benchmarks/results/parsing_decode-DEVICE.json`` (``--tag`` adds a suffix).

    python benchmarks/parsing_decode.py RUN_DIR [--trees FILE] [--sentences 30]
        [--batch-sizes 1 4 16 64 tokens] [--repeats 3] [--baseline main] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, write_json  # noqa: E402

from seqtrans.data import pad_batch, source_ids  # noqa: E402
from seqtrans.decoding import beam as current_beam  # noqa: E402
from seqtrans.decoding.generate import length_batches, max_output_length  # noqa: E402
from seqtrans.decoding.search import Hypothesis  # noqa: E402
from seqtrans.pipeline import Loaded, load, read_split  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
Search = Callable[..., list[list[Hypothesis]]]


def baseline_search(rev: str) -> Search:
    """``beam_search`` as git revision ``rev`` wrote it, imported beside this checkout's engine."""
    text = subprocess.run(["git", "show", f"{rev}:seqtrans/decoding/beam.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="parsing-decode-")) / "baseline_beam.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_beam", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.beam_search  # type: ignore[no-any-return]


def batches(lengths: list[int], size: str, batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length in groups of ``size`` sentences, or by ``batch_tokens``."""
    if size == "tokens":
        return list(length_batches(lengths, batch_tokens))
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = int(size)
    return [order[i : i + n] for i in range(0, len(order), n)]


def decode(search: Search, run: Loaded, sources: list[Any], ids: list[list[int]],
           groups: list[list[int]]) -> list[list[Hypothesis]]:
    """What ``generate`` does for these groups, with ``search`` as the beam search."""
    d = run.config.decode
    out: list[list[Hypothesis]] = [[] for _ in ids]
    codec: Any = run.codec
    for idx in groups:
        src = pad_batch([ids[i] for i in idx]).to(run.device)
        max_len = torch.tensor([max_output_length(len(ids[i]) - 1, d) for i in idx])
        constraint = codec.constraint([sources[i] for i in idx]) if d.constrained else None
        hyps = search(run.model, src, beam=d.beam, alpha=d.alpha, max_len=max_len, min_len=d.min_len,
                      nbest=d.nbest, constraint=constraint)
        for i, h in zip(idx, hyps):
            out[i] = h
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="A parsing run directory (or checkpoint).")
    parser.add_argument("--trees", default="", help="Test trees to decode (default: the run's test split).")
    parser.add_argument("--sentences", type=int, default=30, help="Decode the first N test sentences.")
    parser.add_argument("--batch-sizes", nargs="+", default=["1", "4", "16", "64", "tokens"],
                        help="Sentences per batch; 'tokens': the run's decode.batch_tokens.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed runs per batch size (median).")
    parser.add_argument("--baseline", default="", help="Also time the beam search of this git revision.")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="Override decode.* keys.")
    parser.add_argument("--profile", action="store_true", help="Print a cProfile of one run per batch size.")
    parser.add_argument("--tag", default="", help="Suffix of the JSON file's name.")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    overrides = [*args.set, *([f"data.test={args.trees}"] if args.trees else [])]
    run = load(args.run, overrides=overrides, device="cpu")
    examples = read_split(run.task, "test").examples[: args.sentences]
    sources = [ex.source for ex in examples]
    ids = [source_ids(run.codec, s) for s in sources]
    searches: dict[str, Search] = {"current": current_beam.beam_search}
    if args.baseline:
        searches = {"baseline": baseline_search(args.baseline), **searches}
    d = run.config.decode
    print(f"{device_name(run.device)}; {len(sources)} sentences, {sum(len(i) - 1 for i in ids)} source "
          f"tokens; beam {d.beam}, alpha {d.alpha}, constrained {d.constrained}")
    rows = []
    for size in args.batch_sizes:
        groups = batches([len(i) for i in ids], size, d.batch_tokens)
        seconds: dict[str, list[float]] = {name: [] for name in searches}
        outputs: dict[str, list[list[Hypothesis]]] = {}
        for _ in range(args.repeats):  # the searches alternate, so a busier moment hits both
            for name, search in searches.items():
                took, outputs[name] = timed(lambda s=search, g=groups: decode(s, run, sources, ids, g))
                seconds[name].append(took)
        row: dict[str, Any] = {"batch": size, "batches": len(groups)}
        for name in searches:
            row[f"{name}_sent_s"] = len(sources) / statistics.median(seconds[name])
            row[f"{name}_seconds"] = seconds[name]
        line = f"batch {size:>6}: " + ", ".join(f"{n} {row[f'{n}_sent_s']:6.2f} sent/s" for n in searches)
        if args.baseline:
            same = all([(h.tokens, h.log_prob, h.score) for h in a] == [(h.tokens, h.log_prob, h.score)
                                                                         for h in b]
                       for a, b in zip(outputs["baseline"], outputs["current"]))
            row["identical"] = same
            row["speedup"] = row["current_sent_s"] / row["baseline_sent_s"]
            line += f", x{row['speedup']:.2f}, outputs and scores {'identical' if same else 'DIFFER'}"
        print(line, flush=True)
        rows.append(row)
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(decode, current_beam.beam_search, run, sources, ids, groups)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue())
    name = "parsing_decode" + (f"-{args.tag}" if args.tag else "")
    # the run's name only: results name no machine paths
    path = write_json(name, {"run": args.run.name, "sentences": len(sources), "beam": d.beam,
                             "alpha": d.alpha, "constrained": d.constrained, "baseline": args.baseline,
                             "rows": rows}, run.device)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
