"""Streaming transduction on the copy task: how long each output token waits for its source.

Trains the copy task's small Transformer with monotonic encoder-decoder attention and a
causal encoder (``model.cross_attention=monotonic model.causal_encoder=true``) on copying
and on reversing sequences of length 1..L, then decodes the 1,000 test sequences as
streams (``seqtrans.streaming.decoder``) and reports exact match, the average proportion
(AP) and average lagging (AL) of the delays, whether the streamed outputs equal offline
greedy decoding, and the decoding time of both. Copying can write each token right after
reading it (AL near 1); reversing cannot write anything before the whole source is read
(AL near |x|), and the model has to learn that.

    python -m benchmarks streaming_copy --minutes 3
    python -m benchmarks streaming_copy --minutes 3 --jobs 2   # both variants at once, one thread each

Writes benchmarks/results/streaming_copy.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import seqtrans
from benchmarks.common import RESULTS, arguments, write_results
from seqtrans import pipeline
from seqtrans.data.batches import prediction, source_ids
from seqtrans.data.vocab import EOS
from seqtrans.decoding import generate
from seqtrans.inference import evaluation, loading
from seqtrans.streaming.decoder import stream_greedy
from seqtrans.streaming.latency import average_lagging, average_proportion


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def evaluate(out: Path) -> dict[str, Any]:
    loaded = loading.load(out, device="cpu")
    task, codec, model = loaded.task, loaded.codec, loaded.model
    examples = evaluation.read_split(task, "test").examples
    decode = dataclasses.replace(loaded.config.decode, beam=1, nbest=1)
    sources = [source_ids(codec, e.source)[:-1] for e in examples]  # without the end symbol

    started = time.perf_counter()
    streamed = [list(stream_greedy(model, ids, decode)) for ids in sources]
    stream_seconds = time.perf_counter() - started
    started = time.perf_counter()
    offline = generate(model, [ids + [EOS] for ids in sources], dataclasses.replace(decode, batch_tokens=1),
                       device=torch.device("cpu"))
    offline_seconds = time.perf_counter() - started

    preds = [prediction(codec, [e.token for e in out], ex.source) for out, ex in zip(streamed, examples)]
    same = sum([e.token for e in out] == (hyps[0].tokens if hyps else [])
               for out, hyps in zip(streamed, offline))
    delays = [([e.delay for e in out], len(ids)) for out, ids in zip(streamed, sources) if out and ids]
    return {
        **{k: float(v) for k, v in task.score(preds, examples).items()},
        "same_as_offline_greedy": same / len(examples),
        # against the hypothesis length, as the results already recorded were
        "average_proportion": _mean([average_proportion(d, source_length=n, target_length=len(d))
                                     for d, n in delays]),
        "average_lagging": _mean([average_lagging(d, source_length=n, target_length=len(d))
                                  for d, n in delays]),
        "mean_source_length": statistics.mean(len(s) for s in sources),
        "stream_seconds_per_sentence": stream_seconds / len(examples),
        "offline_seconds_per_sentence": offline_seconds / len(examples),
        "example": {"source": examples[0].source, "output": preds[0],
                    "delays": [e.delay for e in streamed[0]]},
    }


def variant(name: str, reverse: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Train (unless already trained) and evaluate one task variant."""
    torch.set_num_threads(args.threads)
    out = Path(args.work) / name
    if not (out / "metrics.json").is_file():
        config = seqtrans.resolve_config("copy", overrides=[
            f"data.max_length={args.length}", f"data.reverse={str(reverse).lower()}",
            "data.train_size=100000", f"train.max_minutes={args.minutes}", "train.max_steps=1000000",
            "train.eval_every=1000", "train.valid_max_examples=200",
            "model.cross_attention=monotonic", "model.causal_encoder=true"])
        pipeline.run(config, out, device="cpu")
    result = evaluate(out)
    result["train_steps"] = json.loads((out / "metrics.json").read_text())["train_steps"]
    return result


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--minutes", type=float, default=3.0, help="Training budget per task variant.")
    parser.add_argument("--length", type=int, default=20, help="L: sequence lengths 1..L.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="Variants trained at the same time.")
    parser.add_argument("--work", default="runs/streaming_copy")
    parser.add_argument("--out", type=Path, default=RESULTS / "streaming_copy.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, Any] = {"settings": {"minutes": args.minutes, "length": args.length,
                                            "threads": args.threads, "jobs": args.jobs}}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {name: pool.submit(variant, name, reverse, args)
                   for name, reverse in (("copy", False), ("reverse", True))}
        for name, future in futures.items():
            results[name] = r = future.result()
            print(f"{name:>8}: exact {r['exact_match']:.3f}, AP {r['average_proportion']:.3f}, "
                  f"AL {r['average_lagging']:.2f} (mean |x| {r['mean_source_length']:.1f}), "
                  f"same as offline {r['same_as_offline_greedy']:.3f}, {r['train_steps']} steps", flush=True)
    write_results(args.out, results, sort_keys=False)
