"""Fixed-size memory attention against scaled-dot on long inputs: Multi30k documents.

Britz et al. (2017) claim that memory attention with K = 32 or 64 slots matches standard
attention and decodes faster where the source is longer than its memory. Multi30k's
sentences (15 tokens) are shorter than K; here each example is a document of ``--join``
consecutive sentences (the translation task's ``data.join_lines``: about 100 source words
at 8), built from each split's own lines, so that the test documents are whole.

Every model is trained with the same settings but its encoder-decoder attention:
scaled-dot, and memory attention with K in ``--slots``, without and with the local prior
(``model.memory_local_width=1``; ``-local``). The memory models score the contexts by
their content (``model.memory_decoder_score=content``), with the paper's position
encodings and one head, so that a step reads K contexts, fewer than a document's tokens.
Each model is then loaded in a process of its own (its peak memory its own) and decodes
the test documents end to end (text in, text out, as ``seqtrans predict``) with beam 4:

- ``b1_seconds`` and ``b32_seconds``: one document at a time and in batches of 32, every
  hypothesis held to the same output length (``--output-length``; by default the median
  reference length of the test documents in target tokens), so that every model does the
  same number of steps whatever it has learned;
- ``free_b32_seconds``, ``timed_bleu`` and the output lengths: the same batches of 32
  decoded with the task's own settings (the length penalty of the preset), scored with
  sacreBLEU; ``bleu`` is the run's own test decoding of every test document (the same
  settings);
- the load average before and after each timing, and the peak memory of the batches of
  32 over the loaded model and of the whole process.

Then ``torch.profiler`` profiles scaled-dot and the smallest memory model decoding at
batch 1 and 32 (the same held lengths), and the share of the time spent in
encoder-decoder attention is measured apart (the profiler's own cost left out).

    python -m benchmarks memory_long --mirror ../shared/data/multi30k
    python -m benchmarks memory_long --mirror ../shared/data/multi30k --steps 300 --d-model 128 --layers 2
    python -m benchmarks memory_long --smoke --mirror ../shared/data/multi30k --work runs/memory-long-smoke

Models already trained in ``--work`` with the same settings are reused; the timings are
always taken anew, so that the models compare within one run. ``--train-only`` trains and
stops, so that trainings can run side by side (a process per core, each with ``--models``)
before one run times every model alone. Writes
``benchmarks/results/memory_long.json`` (``--out``), with a row per model; ``--smoke``
runs the same steps with a tiny model on a sliver of the data (numbers that mean
nothing), writing into ``--work`` only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

import seqtrans
from benchmarks.common import (
    RESULTS,
    CrossAttentionClock,
    arguments,
    budget,
    cpu_info,
    peak_memory,
    process_peak_mib,
    timed_once,
    write_results,
)
from seqtrans import pipeline, tasks
from seqtrans.config import DecodeConfig, RunConfig
from seqtrans.decoding.generate import decoding_model
from seqtrans.decoding.search import Hypothesis
from seqtrans.inference import evaluation, loading
from seqtrans.inference.loaded import Loaded
from seqtrans.runtime import atomic
from seqtrans.tasks import Example

OUT = RESULTS / "memory_long.json"
T = TypeVar("T")
#: The memory models' settings besides K: content scores, the paper's position encodings, one head.
MEMORY = ["model.cross_attention=memory", "model.memory_decoder_score=content", "model.memory_positions=true"]
LOCAL = ["model.memory_local_width=1"]
TINY = ["model.d_ff=64", "model.heads=2", "data.vocab_size=1000", "train.max_tokens=2048",
        "train.valid_max_examples=4", "data.max_train_examples=48"]
NOTE = ("BLEU here is of briefly trained small models (see settings): it ranks the mechanisms at this "
        "budget and is not the paper's comparison of converged models. The timings hold every "
        "hypothesis to the same output length, so every model does the same number of decoding steps.")


def models(slots: Sequence[int]) -> dict[str, tuple[int, list[str]]]:
    """Each model's name, its K (0: scaled-dot) and its settings beyond the shared ones."""
    out: dict[str, tuple[int, list[str]]] = {"scaled-dot": (0, [])}
    for k in slots:
        out[f"memory-K{k}"] = (k, [*MEMORY, f"model.memory_slots={k}"])
        out[f"memory-K{k}-local"] = (k, [*MEMORY, f"model.memory_slots={k}", *LOCAL])
    return out


def shared(args: argparse.Namespace) -> list[str]:
    """Every model's settings: the data, the model's size and the training budget."""
    out = [*budget(args.steps, checkpoints=10), f"data.join_lines={args.join}",
           f"model.encoder_layers={args.layers}", f"model.decoder_layers={args.layers}",
           f"model.d_model={args.d_model}", f"model.d_ff={4 * args.d_model}", f"model.heads={args.heads}",
           "train.eval_every=100000"]
    if args.mirror:
        out.append(f"data.mirror={Path(args.mirror).resolve()}")
    if args.smoke:
        out += [*TINY, f"data.test_tsv={(Path(args.work) / 'test.tsv').resolve()}",
                f"data.cache_dir={(Path(args.work) / 'cache').resolve()}"]
    return [*out, *args.set]


def recorded(settings: list[str], args: argparse.Namespace) -> list[str]:
    """``settings`` as the results record them: the mirror as given, not as this machine resolves it."""
    return [f"data.mirror={args.mirror}" if s.startswith("data.mirror=") else s for s in settings]


def in_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh process of its own: its peak memory is its own, and no
    model, allocator or thread pool of an earlier call is in it."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


# ---------------------------------------------------------------------- training


#: Data settings that say where files come from, not what the examples are.
WHERE = ("mirror", "cache_dir")


def _same_settings(out: Path, config: RunConfig) -> bool:
    """Whether the run in ``out`` was trained with ``config``'s model, training and data settings."""
    saved = json.loads((out / "config.json").read_text())
    defaults = RunConfig()

    def settings(section: str, values: dict[str, Any]) -> Any:
        # as JSON holds them, the defaults of keys it lacks filled in
        return json.loads(json.dumps({**dataclasses.asdict(getattr(defaults, section)), **values}))

    def data(values: dict[str, Any]) -> Any:
        return json.loads(json.dumps({k: v for k, v in values.items() if k not in WHERE}))

    return (all(settings(s, saved.get(s, {})) == settings(s, dataclasses.asdict(getattr(config, s)))
                for s in ("model", "train"))
            and data(saved.get("data", {})) == data(dataclasses.asdict(config.data)))


def train(name: str, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Train one model, unless ``--work`` holds it with these settings; its run's metrics."""
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.work) / name
    config = seqtrans.resolve_config("translation", preset="cpu", overrides=[*shared(args), *overrides])
    if (out / "metrics.json").is_file():
        if not _same_settings(out, config):
            raise SystemExit(f"{out} holds a model trained with other settings: remove it or choose --work")
    else:
        pipeline.run(config, out, device="cpu")
    return dict(json.loads((out / "metrics.json").read_text()))


# ---------------------------------------------------------------------- decoding


def _load(name: str, args: argparse.Namespace) -> tuple[Loaded, list[Example[str, str]]]:
    """A model loaded, with the test documents (``--documents`` of them, 0: all)."""
    torch.set_num_threads(args.threads)
    loaded = loading.load(Path(args.work) / name, device="cpu")
    return loaded, evaluation.read_split(loaded.task, "test").examples[: args.documents or None]


def held(decode: DecodeConfig, length: int) -> DecodeConfig:
    """``decode`` at beam 4 with every output exactly ``length`` tokens long, a batch decoded at once."""
    return dataclasses.replace(decode, beam=4, nbest=1, min_len=length, max_len_a=0.0, max_len_b=length,
                               batch_tokens=10**9)


def decode_all(loaded: Loaded, texts: list[str], size: int, decode: DecodeConfig) -> list[Hypothesis]:
    """Every text decoded end to end (parsed, searched, written as ``seqtrans predict``
    writes it: the hypothesis's ``text``), ``size`` at a time: the best hypothesis of each."""
    out = []
    for i in range(0, len(texts), size):
        _, hyps = loaded.decode(loaded.parse(texts[i:i + size]), decode=decode)
        out += [nbest[0] for nbest in hyps]
    return out


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _timed(fn: Callable[[], T]) -> tuple[dict[str, Any], T]:
    """Seconds of one call of ``fn`` with the load average (1, 5, 15 minutes) before and after it."""
    before = _load_average()
    seconds, result = timed_once(fn)
    return {"seconds": round(seconds, 3), "load_before": before, "load_after": _load_average()}, result


def lengths(loaded: Loaded, examples: list[Example[str, str]]) -> dict[str, float]:
    """Median source and reference lengths of the documents, in the model's tokens (pieces)."""
    codec = loaded.codec
    return {"median_source_tokens": statistics.median(len(codec.source_tokens(e.source)) for e in examples),
            "median_reference_tokens": statistics.median(len(codec.target_tokens(e.target))
                                                         for e in examples)}


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One model's timings, memory and BLEU, in a process of its own (:func:`in_process`)."""
    loaded, examples = _load(name, args)
    sources = [e.source for e in examples]
    row: dict[str, Any] = {"model": name, "documents": len(examples), **lengths(loaded, examples)}
    length = args.output_length or int(row["median_reference_tokens"])
    fixed = held(loaded.config.decode, length)
    decode_all(loaded, sources[:2], 1, fixed)  # warm up: the decoding copy of the model, the allocator
    b1, _ = _timed(lambda: decode_all(loaded, sources, 1, fixed))
    with peak_memory(torch.device("cpu")) as peak:
        b32, _ = _timed(lambda: decode_all(loaded, sources, 32, fixed))
    free = dataclasses.replace(loaded.config.decode, beam=4, nbest=1, batch_tokens=10**9)
    b32_free, hyps = _timed(lambda: decode_all(loaded, sources, 32, free))
    scores = loaded.task.score([str(h.text) for h in hyps], examples)
    outputs = [len(h.tokens) for h in hyps]
    return {**row, "output_length": length, "b1": b1, "b32": b32, "free_b32": b32_free,
            "timed_bleu": round(float(scores["bleu"]), 2), "free_output_tokens": sum(outputs),
            "free_median_output_tokens": statistics.median(outputs),
            "b32_peak_mib": round(peak["mib"], 1), "process_peak_mib": round(process_peak_mib(), 1)}


# ---------------------------------------------------------------------- where the time goes


def attention_share(loaded: Loaded, texts: list[str], size: int, decode: DecodeConfig) -> float:
    """The share of end-to-end decoding time spent in encoder-decoder attention (its
    ``prepare`` once per source and its steps), timed on the model that decodes."""
    model = decoding_model(loaded.model, decode.precision, loaded.device)
    clock = CrossAttentionClock(model)
    try:
        seconds, _ = timed_once(lambda: decode_all(loaded, texts, size, decode))
    finally:
        clock.close()
    return round(clock.seconds / seconds, 3)


def top_operations(prof: Any, count: int) -> list[dict[str, Any]]:
    """The ``count`` operators with the most self CPU time, with their share of all of it."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"operation": e.key, "self_ms": round(e.self_cpu_time_total / 1000, 2),
             "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in events[:count]]


def profile(name: str, args: argparse.Namespace, length: int) -> dict[str, Any]:
    """Where one model's decoding time goes at batch 1 and 32 (outputs held to ``length``
    tokens): the attention's share, timed apart, and the operators torch.profiler finds."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    loaded, examples = _load(name, args)
    sources = [e.source for e in examples]
    fixed = held(loaded.config.decode, length)
    decode_all(loaded, sources[:2], 1, fixed)  # warm up
    out: dict[str, Any] = {"model": name, "output_length": length}
    for size, texts in ((1, sources[: args.profile_documents]), (32, sources[:32])):
        share = attention_share(loaded, texts, size, fixed)
        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            decode_all(loaded, texts, size, fixed)
        out[f"b{size}"] = {"documents": len(texts), "attention_share": share,
                           "operations": top_operations(prof, args.profile_top)}
    return out


# ---------------------------------------------------------------------- the results


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(run[key]["seconds"] for run in runs), 3)


def row(name: str, slots: int, trained: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's row: the medians over the rounds, each round's timings with its load."""
    first = runs[0]
    out = {"model": name, "slots": slots, "local_prior": name.endswith("-local"),
           "bleu": round(float(trained["bleu"]), 2), "test_documents": trained["test_sentences"],
           "timed_bleu": first["timed_bleu"],
           "b1_seconds": _median(runs, "b1"), "b32_seconds": _median(runs, "b32"),
           "free_b32_seconds": _median(runs, "free_b32"),
           "median_source_tokens": first["median_source_tokens"],
           "median_reference_tokens": first["median_reference_tokens"],
           "output_length": first["output_length"], "documents": first["documents"],
           "free_output_tokens": first["free_output_tokens"],
           "free_median_output_tokens": first["free_median_output_tokens"],
           "b32_peak_mib": first["b32_peak_mib"], "process_peak_mib": first["process_peak_mib"],
           "updates": trained["train_steps"], "train_minutes": trained["train_minutes"],
           "params": trained["params"], "train_tokens_per_s": trained["train_tokens_per_s"]}
    out["rounds"] = [{key: run[key] for key in ("b1", "b32", "free_b32")} for run in runs]
    return out


def against_scaled_dot(rows: list[dict[str, Any]]) -> None:
    """Each memory row's speed-ups and BLEU difference against scaled-dot, and whether it
    meets the issue's target: K at most a quarter of the median source, within 1 BLEU,
    at least 1.2 times as fast at batch 1."""
    base = next((r for r in rows if r["slots"] == 0), None)
    if base is None:
        return
    for r in rows:
        if r["slots"] == 0:
            continue
        r["b1_speedup"] = round(base["b1_seconds"] / r["b1_seconds"], 3)
        r["b32_speedup"] = round(base["b32_seconds"] / r["b32_seconds"], 3)
        r["bleu_difference"] = round(r["bleu"] - base["bleu"], 2)
        r["target_met"] = (r["slots"] <= r["median_source_tokens"] / 4 and r["bleu_difference"] >= -1
                           and r["b1_speedup"] >= 1.2)


def _smoke_test_file(args: argparse.Namespace) -> None:
    """The smoke run's test file: two documents' worth of test2016 sentences."""
    where = [f"data.cache_dir={(Path(args.work) / 'cache').resolve()}"]
    if args.mirror:
        where.append(f"data.mirror={Path(args.mirror).resolve()}")
    config = seqtrans.resolve_config("translation", preset="cpu", overrides=where)
    examples = evaluation.read_split(tasks.load("translation")(config.data), "test").examples
    lines = [f"{' '.join(e.source.split())}\t{' '.join(e.target.split())}\n"
             for e in examples[: 2 * args.join]]
    atomic.write_text(Path(args.work) / "test.tsv", "".join(lines))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = arguments(__doc__)
    parser.add_argument("--join", type=int, default=8, help="Sentences per document (data.join_lines).")
    parser.add_argument("--slots", type=int, nargs="+", default=[16, 32, 64], help="The memory models' K.")
    parser.add_argument("--models", nargs="+", metavar="NAME",
                        help="Only these models, e.g. scaled-dot memory-K16.")
    parser.add_argument("--steps", type=int, default=2000, help="Training updates of every model.")
    parser.add_argument("--d-model", type=int, default=256, help="Model width (d_ff is 4 times it).")
    parser.add_argument("--layers", type=int, default=3, help="Encoder layers, and as many decoder layers.")
    parser.add_argument("--heads", type=int, default=4, help="Attention heads of scaled-dot attention.")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="More settings for every model.")
    parser.add_argument("--documents", type=int, default=0, help="Test documents decoded; 0: all.")
    parser.add_argument("--output-length", type=int, default=0,
                        help="Tokens every timed output is held to; 0: the median reference length.")
    parser.add_argument("--rounds", type=int, default=1,
                        help="Timing rounds, every model once in each in turn: the median is reported.")
    parser.add_argument("--profile", nargs="*", metavar="NAME",
                        help="Models profiled (default: scaled-dot and the smallest memory model).")
    parser.add_argument("--profile-documents", type=int, default=4, help="Documents profiled at batch 1.")
    parser.add_argument("--profile-top", type=int, default=12, help="Operators kept of each profile.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every process.")
    parser.add_argument("--work", default="runs/memory_long", help="Where the models are trained.")
    parser.add_argument("--mirror", help="A directory holding the Multi30k files (data.mirror).")
    parser.add_argument("--out", type=Path, help=f"The results JSON (default benchmarks/results/{OUT.name}; "
                                                  "with --smoke, WORK/memory_long-smoke.json).")
    parser.add_argument("--train-only", action="store_true",
                        help="Train the models and stop: trainings of other models may then run beside it "
                             "(say, one process per core), and a later run without it times them alone.")
    parser.add_argument("--smoke", action="store_true",
                        help="A tiny model, 2 updates, 48 training documents, 2 test documents, outputs of "
                             "8 tokens: checks the steps fit together.")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.d_model, args.layers, args.heads = 2, 32, 1, 2
        args.output_length = args.output_length or 8
        args.profile_documents = 1
    args.out = args.out or (Path(args.work) / "memory_long-smoke.json" if args.smoke else OUT)
    return args


def main(argv: list[str]) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.smoke:
        _smoke_test_file(args)
    settings = models(args.slots)
    unknown = sorted(set(args.models or []) - set(settings))
    if unknown:
        raise SystemExit(f"--models: no model {', '.join(unknown)}; the models: {', '.join(settings)}")
    chosen = [name for name in settings if not args.models or name in args.models]
    result: dict[str, Any] = {
        "benchmark": "memory_long", "note": NOTE, "settings": recorded(shared(args), args),
        "models": {name: settings[name][1] for name in chosen},
        "machine": {"processor": cpu_info()["model"], "cpus": os.cpu_count(), "threads": args.threads,
                    "torch": torch.__version__},
        "rows": [], "profile": []}
    trained = {}
    for name in chosen:
        trained[name] = in_process(train, name, settings[name][1], args)
        print(f"{name}: trained, {trained[name]['train_steps']} updates, run BLEU {trained[name]['bleu']}",
              flush=True)
    if args.train_only:
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name in chosen:  # in turn, so that a slow spell of the machine is every model's
            runs[name].append(in_process(measure, name, args))
            print(f"{name}: b1 {runs[name][-1]['b1']}, b32 {runs[name][-1]['b32']}", flush=True)
    result["rows"] = [row(name, settings[name][0], trained[name], runs[name]) for name in chosen]
    against_scaled_dot(result["rows"])
    write_results(args.out, result, sort_keys=False)
    smallest = [f"memory-K{min(args.slots)}"] if args.slots else []
    profiled = [n for n in (args.profile if args.profile is not None else ["scaled-dot", *smallest])
                if n in chosen]
    length = result["rows"][0]["output_length"]
    result["profile"] = [in_process(profile, name, args, length) for name in profiled]
    write_results(args.out, result, sort_keys=False)
    for r in result["rows"]:
        print(f"{r['model']:>18} K={r['slots']:>2}  BLEU {r['bleu']:6.2f}  b1 {r['b1_seconds']:8.2f} s  "
              f"b32 {r['b32_seconds']:7.2f} s  peak {r['b32_peak_mib']:7.1f} MiB")
    print(f"wrote {args.out}")
