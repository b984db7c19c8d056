"""Simultaneous translation and the seeds' attention mechanisms on Multi30k en-de.

Trains every model at the same budget (the translation task's ``cpu`` preset, stopped
after ``--steps`` updates so that the budget does not depend on what else the machine is
doing; each model's training minutes are reported), or reuses a model already trained
in ``--work`` with the same settings, then measures on test2016:

- simultaneous policies, each decoding the test sources as streams (source words
  arriving one at a time, greedy, as ``seqtrans evaluate --stream``): sacreBLEU, chrF,
  and the latency metrics AP, AL, LAAL and DAL in source words as SimulEval computes
  them; every streamed output is checked against offline greedy decoding with the same
  lag. The models: the full-sentence model with the same causal encoder (the quality
  ceiling: it reads the whole source first), one multi-k wait-k model (Elbayad et al.
  2020) decoded at k in ``--ks``, a wait-3 model, the seed's hard monotonic attention
  (Raffel et al. 2017), monotonic infinite lookback (MILk, Arivazhagan et al. 2019)
  at the latency weights ``--latency-weights``, and monotonic chunkwise attention
  (MoChA, Chiu and Raffel 2018; ``mocha-0.1``, trained from scratch as the wait-k models are);
- memory attention (Britz et al. 2017; a K sweep, four heads, a local prior) against
  scaled-dot encoder-decoder attention,
  both with the same causal encoder (so the full-sentence model above is the scaled-dot
  model of this comparison): BLEU and chrF (beam 4), the decoding time
  of the test set (beam 4 and greedy; in batches and one sentence at a time) and the
  share of it spent in encoder-decoder attention; then the encoder-decoder attention
  alone, per decoding step, against the source length (random weights), where the
  seed's fixed-size memory should pay off.

    python -m benchmarks simultaneous_multi30k
    python -m benchmarks simultaneous_multi30k --models full multi-k
    python -m benchmarks simultaneous_multi30k --part simultaneous --models mocha-0.1
    python -m benchmarks simultaneous_multi30k --plot benchmarks/results/simultaneous_multi30k.json

Each model is scored as soon as it is trained and the results file rewritten then; a
later invocation with the same budget keeps the models the file holds and does the rest.
``--train-only`` trains and stops, so that trainings can run side by side (a process per
core, each with ``--models``) before one invocation scores every model.
Writes ``benchmarks/results/simultaneous_multi30k.json`` and the BLEU-against-AL
picture ``docs/images/simultaneous-multi30k.png``; ``python docs/generate.py`` puts
the tables into docs/streaming-multi30k.md and docs/attention-results.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import seqtrans
from benchmarks.common import RESULTS, ROOT, arguments, budget, cpu_info, write_results
from seqtrans import pipeline
from seqtrans.config import ModelConfig, RunConfig
from seqtrans.data.batches import source_ids
from seqtrans.decoding import generate
from seqtrans.inference import evaluation, loading
from seqtrans.model.transformer import Transformer

PICTURE = ROOT / "docs" / "images" / "simultaneous-multi30k.png"

#: Checkpoints over each model's updates, the last five averaged.
CHECKPOINTS = 20
CAUSAL = ["model.causal_encoder=true"]
# hard monotonic attention with its energies divided by T = 0.2 and r starting at -0.5, as
# SeamlessStreaming's monotonic decoder has them
SHARPENED = ["model.monotonic_temperature=0.2", "model.monotonic_r_init=-0.5"]
SHARP = ["model.cross_attention=monotonic", *SHARPENED]
# The K sweep of memory attention whose decoder scores the contexts by their content (the
# contexts are the input-dependent memory; beta then depends on them too). Multi30k's sources
# are 15 tokens on average, so K = 32 exceeds nearly all of them (docs/attention-results.md). The
# paper's scoring (beta from the decoder state alone) at K = 16 is in the previous run's results.
MEMORY_SLOTS = (8, 32)
# and with four heads (model.memory_heads), each scoring the contexts with its own query and
# key slices and mixing its own values, as scaled-dot attention's four heads do over positions
MEMORY_HEAD_SLOTS = (16, 32)
# and K = 32 with four heads and the local prior (model.memory_local_width, one slot spacing),
# so that each of a sentence's positions can have contexts of its own
LOCAL = ["model.memory_heads=4", "model.memory_local_width=1"]
# The pre-sigmoid noise scales tried on the single monotonic head (the paper's is 1), and
# with the largest, half the latency weight.
MONOTONIC_NOISE = (2, 3, 3.5, 4)
# MoChA's chunk widths fine-tuned from the full model with the single head's best recipe
MOCHA_CHUNKS = (2, 4)


def models(latency_weights: list[float]) -> dict[str, list[str]]:
    """Each model's settings beyond the shared budget, by name (its run directory's); each
    of LONGER also as NAME-long, the same settings trained for LONGER_FACTOR times the updates."""
    settings = {
        "full": CAUSAL,
        "multi-k": [*CAUSAL, "model.multi_k=true"],
        **{f"milk-{w:g}": [*CAUSAL, "model.cross_attention=milk", f"train.latency_weight={w:g}"]
           for w in latency_weights},
        "wait-3": [*CAUSAL, "model.wait_k=3"],
        # MoChA with chunks of two positions and MMA-IL's latency weight, from scratch like wait-3
        "mocha-0.1": [*CAUSAL, "model.cross_attention=mocha", "model.chunk_size=2",
                      "train.latency_weight=0.1"],
        "monotonic": [*CAUSAL, "model.cross_attention=monotonic"],
        # monotonic multihead attention with the recipes' latency weights (Ma et al. 2020;
        # fairseq's MMA-IL lambda_avg 0.1, MMA-H lambda_var 0.1), and MMA-IL fine-tuned from
        # the full-sentence model (as EMMA, Ma et al. 2023, starts its policy): INIT says from which
        "mma-il": [*CAUSAL, "model.cross_attention=mma_il", "train.latency_weight=0.1"],
        "mma-h": [*CAUSAL, "model.cross_attention=mma_hard", "train.latency_weight_var=0.1"],
        "mma-il-init": [*CAUSAL, "model.cross_attention=mma_il", "train.latency_weight=0.1"],
        # the seed's hard monotonic attention started the same way (its attention new, the rest taken)
        "monotonic-init": [*CAUSAL, "model.cross_attention=monotonic"],
        # and with its energies sharpened (SHARP), so that training's expected alignment is
        # nearer the hard decisions of decoding
        "monotonic-init-t0.2": [*CAUSAL, *SHARP],
        # and with a latency loss as well (MMA-IL's lambda), which the single head had none of
        "monotonic-init-latency": [*CAUSAL, *SHARP, "train.latency_weight=0.1"],
        # and with more than the paper's pre-sigmoid noise (MONOTONIC_NOISE), which is what
        # should push the selection probabilities to 0 or 1 (the learned gain cannot rescale
        # it away); the largest also with half the latency weight
        **{f"monotonic-init-latency-noise{n:g}": [*CAUSAL, *SHARP, "train.latency_weight=0.1",
                                                   f"model.monotonic_noise={n:g}"] for n in MONOTONIC_NOISE},
        "monotonic-init-latency0.05-noise4": [*CAUSAL, *SHARP, "train.latency_weight=0.05",
                                              "model.monotonic_noise=4"],
        # MoChA with that recipe (SHARPENED, the latency loss, noise 3.5), also from the full model:
        # the same read policy, attending a soft chunk of w positions ending where it stops
        # instead of that one position
        **{f"mocha-init-w{w}": [*CAUSAL, "model.cross_attention=mocha", f"model.chunk_size={w}",
                                *SHARPENED, "train.latency_weight=0.1", "model.monotonic_noise=3.5"]
           for w in MOCHA_CHUNKS},
        # their control: multi-k wait-k fine-tuned from the full-sentence model for the same updates,
        # so that a policy started from ``full`` is compared with a wait-k curve of the same training
        "multi-k-init": [*CAUSAL, "model.multi_k=true"],
        **{f"memory-content-{k}": [*CAUSAL, "model.cross_attention=memory", f"model.memory_slots={k}",
                                   "model.memory_positions=true", "model.memory_decoder_score=content"]
           for k in MEMORY_SLOTS},
        **{f"memory-content-{k}-h4": [*CAUSAL, "model.cross_attention=memory", f"model.memory_slots={k}",
                                      "model.memory_positions=true", "model.memory_decoder_score=content",
                                      "model.memory_heads=4"]
           for k in MEMORY_HEAD_SLOTS},
        "memory-content-32-h4-local": [*CAUSAL, "model.cross_attention=memory", "model.memory_slots=32",
                                       "model.memory_positions=true", "model.memory_decoder_score=content",
                                       *LOCAL],
    }
    return {**settings, **{f"{name}-long": settings[name] for name in LONGER}}


#: Models fine-tuned from another of the benchmark's models (``run --init``), which must be
#: trained first; the same number of updates as from scratch.
INIT = {"mma-il-init": "full", "monotonic-init": "full", "monotonic-init-t0.2": "full",
        "monotonic-init-latency": "full", "multi-k-init": "full",
        "monotonic-init-latency0.05-noise4": "full",
        **{f"monotonic-init-latency-noise{n:g}": "full" for n in MONOTONIC_NOISE},
        **{f"mocha-init-w{w}": "full" for w in MOCHA_CHUNKS}}

#: Models also trained for LONGER_FACTOR times the budget's updates, as NAME-long (the
#: warm-up and the checkpoints' spacing the budget's): whether a longer fine-tune settles the
#: single head's undecided first layer and MoChA's, against the wait-k control of as many
#: updates. NAME-long continues a copy of NAME's run from its last checkpoint: a resumed run
#: takes the updates one trained from the start would.
LONGER = ("monotonic-init-latency-noise3.5", "mocha-init-w2", "multi-k-init")
LONGER_FACTOR = 2
INIT |= {f"{name}-long": INIT[name] for name in LONGER}


def learned_policy(name: str) -> bool:
    """Whether the model's encoder-decoder attention decides when to read (monotonic, MILk, MoChA, MMA)."""
    return name.startswith(("monotonic", "milk-", "mocha-", "mma-"))


def train(name: str, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Train one model (unless already trained with these settings); its run's metrics."""
    torch.set_num_threads(args.threads)
    out = Path(args.work) / name
    shared = budget(args.steps, checkpoints=CHECKPOINTS)
    shorter = name.removesuffix("-long") if name.endswith("-long") else None
    if shorter:
        shared.append(f"train.max_steps={LONGER_FACTOR * args.steps}")
    config = seqtrans.resolve_config("translation", preset="cpu", overrides=[*shared, *overrides, *args.set])
    done = out / "metrics.json"
    if done.is_file():
        saved = json.loads((out / "config.json").read_text())
        defaults = RunConfig()

        def settings(section: str, values: dict[str, Any]) -> Any:
            # as JSON holds them (a tuple is a list there), the defaults of keys it lacks filled in
            return json.loads(json.dumps({**dataclasses.asdict(getattr(defaults, section)), **values}))

        if any(settings(section, saved.get(section, {}))
               != settings(section, dataclasses.asdict(getattr(config, section)))
               for section in ("model", "train")):
            raise SystemExit(f"{out} holds a model trained with other settings: remove it or choose --work")
    else:
        logging.getLogger("seqtrans").setLevel(logging.WARNING)
        init = None
        if shorter and not out.exists():
            if not (Path(args.work) / shorter / "metrics.json").is_file():
                raise SystemExit(f"{name} continues {shorter}, which is not trained yet in {args.work}: "
                                 f"run --models {shorter} first")
            # its checkpoints, vocabulary and settings, not its scores or its averaged model
            shutil.copytree(Path(args.work) / shorter, out, ignore=shutil.ignore_patterns(
                "metrics.json", "predictions", "average.pt", "best.pt"))
        if name in INIT:
            start = Path(args.work) / INIT[name]
            if not (start / "metrics.json").is_file():
                raise SystemExit(f"{name} starts from {INIT[name]}, which is not trained yet in {args.work}: "
                                 f"run --models {INIT[name]} first")
            init = seqtrans.initial(start)
            config = seqtrans.with_initial_model(config, init, overrides)
        pipeline.run(config, out, device="cpu", init=init)
    start = {"init": INIT[name]} if name in INIT else {}
    return {"settings": overrides, **start, **json.loads(done.read_text())}


# ---------------------------------------------------------------------- simultaneous


def simultaneous(name: str, ks: list[int], args: argparse.Namespace, *,
                 thresholds: list[float] | None = None) -> list[dict[str, Any]]:
    """Streaming evaluation of one model at each lag (0: the model's own policy), and a
    learned policy at each stopping threshold (``decode.monotonic_threshold``)."""
    from seqtrans.streaming.evaluation import score_stream

    torch.set_num_threads(args.threads)
    out = Path(args.work) / name
    rows = []
    levels = (thresholds or args.thresholds) if learned_policy(name) else [None]
    for k, threshold in [(k, t) for k in ks for t in levels]:
        overrides = (["decode.beam=1"] + ([f"decode.wait_k={k}"] if k else [])
                     + ([f"decode.monotonic_threshold={threshold:g}"] if threshold is not None else []))
        loaded = loading.load(out, overrides=overrides, device="cpu")
        split = evaluation.read_split(loaded.task, "test")
        started = time.perf_counter()
        outputs, metrics = score_stream(loaded, split)
        seconds = time.perf_counter() - started
        same = same_as_offline(loaded, split, [o.tokens for o in outputs])
        rows.append({"model": name, "wait_k": k or None, "threshold": threshold, **metrics,
                     "same_as_offline": same, "stream_seconds": round(seconds, 1)})
        print(f"{name:>12} k={k or '-':>2} τ={threshold or '-'}: BLEU {metrics['bleu']:.2f}  "
              f"AL {metrics['stream_al']:.2f}  "
              f"LAAL {metrics['stream_laal']:.2f}  AP {metrics['stream_ap']:.3f}  "
              f"DAL {metrics['stream_dal']:.2f}  "
              f"same as offline {same:.3f}", flush=True)
    return rows


def same_as_offline(loaded: loading.Loaded, split: evaluation.Split, streamed: list[list[int]]) -> float:
    """The fraction of streamed outputs (target ids) equal to offline greedy decoding
    with the same lag."""
    ids = [source_ids(loaded.codec, e.source) for e in split.examples]
    decode = dataclasses.replace(loaded.config.decode, beam=1, nbest=1)
    offline = generate(loaded.model, ids, decode, device=loaded.device)
    return sum(s == (h[0].tokens if h else []) for s, h in zip(streamed, offline)) / len(ids)


def policy_gap(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """A monotonic or MILk model decoded offline (greedy) twice: with its hard test-time
    decisions (what the stream writes) and with the expected alignment it was trained with
    (no noise), which no stream can follow: the BLEU between them is what the hard policy
    loses."""
    from seqtrans.attention.monotonic import MonotonicAttention
    from seqtrans.attention.multihead_monotonic import MultiheadMonotonicAttention

    torch.set_num_threads(args.threads)
    row: dict[str, Any] = {"model": name}
    for mode in ("hard", "expected"):
        # loaded afresh: decoding keeps a copy of the model made at its first use
        loaded = loading.load(Path(args.work) / name, overrides=["decode.beam=1"], device="cpu")
        split = evaluation.read_split(loaded.task, "test")
        for module in loaded.model.modules():
            if isinstance(module, (MonotonicAttention, MultiheadMonotonicAttention)):
                module.soft_decisions = mode == "expected"
        _, metrics = evaluation.score_examples(loaded.model, loaded.task, loaded.codec, split,
                                               loaded.config.decode, device=loaded.device)
        row.update({f"{mode}_{key}": metrics[key] for key in ("bleu", "bleu_length_ratio", "chrf")})
    row["undecided"] = undecided(loaded, split)
    print(f"{name:>12} offline greedy: hard decisions BLEU {row['hard_bleu']:.2f} "
          f"(length ratio {row['hard_bleu_length_ratio']:.3f}), expected alignment BLEU "
          f"{row['expected_bleu']:.2f} ({row['expected_bleu_length_ratio']:.3f}); selection "
          f"probabilities in [0.1, 0.9] by layer: {row['undecided']}", flush=True)
    return row


def undecided(loaded: loading.Loaded, split: evaluation.Split) -> list[float]:
    """For each decoder layer, the share of the monotonic heads' selection probabilities
    within [0.1, 0.9] over the split's (target, source) position pairs, teacher-forced with
    the references: how far from hard decisions its training left them
    (:func:`seqtrans.streaming.policy.policy_report`)."""
    from seqtrans.data.batches import pad_batch
    from seqtrans.data.encoding import target_ids
    from seqtrans.data.vocab import BOS
    from seqtrans.streaming.policy import policy_report

    examples = split.examples
    batches = ((pad_batch([source_ids(loaded.codec, e.source) for e in chunk]),
                pad_batch([target_ids(loaded.codec, e.target) for e in chunk], before=BOS))
               for chunk in (examples[i:i + 100] for i in range(0, len(examples), 100)))
    return [round(layer.undecided, 3) for layer in policy_report(loaded.model, batches)]


# ---------------------------------------------------------------------- memory attention


class CrossTimer:
    """Time spent in every decoder layer's encoder-decoder attention (its ``prepare``
    once per source and its steps), by wrapping the modules' calls."""

    def __init__(self, model: Transformer) -> None:
        self.seconds = 0.0
        for layer in model.decoder_layers:
            attn: Any = layer.cross_attn
            attn.prepare = self._timed(attn.prepare)
            attn.forward = self._timed(attn.forward)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - started
        return run


def decode_times(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Decoding time of the test set, batched and one at a time, beam 4 and greedy, and
    the share of it in encoder-decoder attention (fp32 ``F.linear``: the same linear
    layers for both mechanisms, so that the attention's own cost shows)."""
    torch.set_num_threads(args.threads)
    os.environ["SEQTRANS_TUNE_MATMUL"] = "0"  # the timer wraps the model's own modules
    loaded = loading.load(Path(args.work) / name, device="cpu")
    examples = evaluation.read_split(loaded.task, "test").examples
    ids = [source_ids(loaded.codec, e.source) for e in examples]
    single = ids[: args.single]
    result: dict[str, Any] = {"model": name, "single_sentences": len(single)}
    for beam in (4, 1):
        decode = dataclasses.replace(loaded.config.decode, beam=beam, nbest=1)
        for mode, sources, config in (("batch", ids, decode),
                                      ("single", single, dataclasses.replace(decode, batch_tokens=1))):
            generate(loaded.model, sources[:20], config, device=loaded.device)  # warm up
            timer = CrossTimer(loaded.model)
            started = time.perf_counter()
            generate(loaded.model, sources, config, device=loaded.device)
            seconds = time.perf_counter() - started
            result[f"beam{beam}_{mode}_seconds"] = round(seconds, 2)
            result[f"beam{beam}_{mode}_attention_share"] = round(timer.seconds / seconds, 3)
            loaded = loading.load(Path(args.work) / name, device="cpu")  # without the timer
    return result


def attention_step(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One decoding step of encoder-decoder attention alone (random weights, the cpu
    preset's width, beam 4 over 32 sentences) against the source length: scaled-dot
    attends over all S positions, memory attention over K slots."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from seqtrans.attention import cross_attention

    rows = []
    for length in (16, 64, 256, 1024):
        row: dict[str, Any] = {"source_length": length}
        for mechanism in ("scaled_dot", "memory"):
            config = ModelConfig(d_model=256, heads=4, cross_attention=mechanism, memory_slots=32,
                                 memory_positions=True)
            attn: Any = cross_attention(mechanism, config)
            attn.eval()
            memory = torch.randn(32, length, 256)
            mask = torch.ones(32, length, dtype=torch.bool)
            x = torch.randn(128, 1, 256)
            with torch.inference_mode():
                state = attn.prepare(memory, mask)
                steps = 50
                for _ in range(5):
                    attn(x, state)
                started = time.perf_counter()
                for _ in range(steps):
                    attn(x, state)
                row[f"{mechanism}_ms_per_step"] = round((time.perf_counter() - started) / steps * 1000, 3)
        row["memory_over_scaled_dot"] = round(row["memory_ms_per_step"] / row["scaled_dot_ms_per_step"], 3)
        rows.append(row)
        print(f"attention step, |x| = {length:>4}: scaled-dot {row['scaled_dot_ms_per_step']:.3f} ms, "
              f"memory {row['memory_ms_per_step']:.3f} ms", flush=True)
    return rows


# ---------------------------------------------------------------------- picture


def read_results(path: Path) -> dict[str, Any]:
    """The results JSON; a malformed file is an error naming the file and line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except OSError as exc:
        raise SystemExit(f"{path}: {exc.strerror}") from None
    if not isinstance(data, dict) or data.get("benchmark") != "simultaneous_multi30k":
        raise SystemExit(f"{path}:1: not this benchmark's results "
                         '(no "benchmark": "simultaneous_multi30k")')
    for number, row in enumerate(data.get("simultaneous", []), 1):
        missing = [key for key in ("model", "bleu", "stream_al") if key not in row]
        if missing:
            raise SystemExit(f"{path}: simultaneous row {number} lacks {', '.join(missing)}")
    return data


def plot(data: dict[str, Any], picture: Path) -> None:
    """BLEU against AL (source words): a curve for each model decoded at several lags
    (multi-k) or stopping thresholds (learned policies), a point for the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["simultaneous"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    names = {"full": "full sentence (causal encoder)", "wait-3": "wait-3 (single k)",
             "monotonic": "hard monotonic", "mma-il": "MMA-IL", "mma-h": "MMA-H",
             "mocha-0.1": "MoChA w=2 λ=0.1",
             "mma-il-init": "MMA-IL from the full model", "multi-k": "multi-k wait-k",
             "multi-k-init": "multi-k wait-k from the full model",
             "monotonic-init": "hard monotonic from the full model",
             "monotonic-init-t0.2": "hard monotonic from the full model, T = 0.2",
             "monotonic-init-latency": "hard monotonic from the full model, latency loss",
             "monotonic-init-latency0.05-noise4":
                "hard monotonic from the full model, latency loss 0.05, noise 4",
             **{f"monotonic-init-latency-noise{n:g}":
                f"hard monotonic from the full model, latency loss, noise {n:g}" for n in MONOTONIC_NOISE},
             **{f"mocha-init-w{w}": f"MoChA w={w} from the full model, latency loss, noise 3.5"
                for w in MOCHA_CHUNKS}}

    def label(name: str) -> str:
        if name.endswith("-long"):
            return label(name.removesuffix("-long")) + f", {LONGER_FACTOR}x the updates"
        return "MILk λ=" + name.removeprefix("milk-") if name.startswith("milk-") else names.get(name, name)

    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in (r for r in rows if r["stream_al"] >= 0):  # a runaway policy's negative AL is left out
        by_model.setdefault(r["model"], []).append(r)
    for name, curve in by_model.items():
        curve = sorted(curve, key=lambda r: r["stream_al"])
        if len(curve) == 1:
            ax.scatter([curve[0]["stream_al"]], [curve[0]["bleu"]], marker="s", label=label(name), zorder=3)
            continue
        ax.plot([r["stream_al"] for r in curve], [r["bleu"] for r in curve], marker="o", label=label(name))
        for r in curve:
            note = f"k={r['wait_k']}" if r.get("wait_k") else f"τ={r.get('threshold') or 0.5:g}"
            ax.annotate(note, (r["stream_al"], r["bleu"]), textcoords="offset points", xytext=(4, -10),
                        fontsize=7)
    ax.set_xlabel("AL (source words, SimulEval: each word once complete)")
    ax.set_ylabel("sacreBLEU, test2016")
    ax.set_title("Multi30k en→de, greedy streams (updates: see the table)")
    ax.set_xlim(0, max(r["stream_al"] for r in rows) + 0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    picture.parent.mkdir(parents=True, exist_ok=True)
    tmp = picture.with_suffix(".tmp.png")
    fig.savefig(tmp)
    os.replace(tmp, picture)


# ---------------------------------------------------------------------- main


def _machine(args: argparse.Namespace) -> dict[str, Any]:
    return {"processor": cpu_info()["model"], "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": args.threads, "jobs": args.jobs}


def model_job(name: str, overrides: list[str], lags: list[int] | None,
              args: argparse.Namespace) -> dict[str, Any]:
    """One model trained (or reused) and, for a simultaneous policy (``lags`` not None),
    scored as streams at each lag: its entries of the results file."""
    trained = {**train(name, overrides, args), "machine": _machine(args)}
    return {"training": trained, "simultaneous": simultaneous(name, lags, args) if lags is not None else [],
            "policy_gap": [policy_gap(name, args)] if learned_policy(name) else []}


def _missing_thresholds(results: dict[str, Any], policies: list[str], args: argparse.Namespace, *,
                        save: Callable[[], None]) -> None:
    """Stream rows of trained learned policies at the thresholds of ``--thresholds`` they
    lack (rows from before thresholds were recorded are at 0.5), decoded ``--jobs`` at once."""
    have = {(r["model"], r.get("threshold") or 0.5) for r in results["simultaneous"]}
    todo = [(name, t) for name in policies if name in results["training"]
            for t in args.thresholds if (name, t) not in have]
    if not todo:
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        jobs = [pool.submit(simultaneous, name, [0], args, thresholds=[t]) for name, t in todo]
        for job in concurrent.futures.as_completed(jobs):
            results["simultaneous"] += job.result()
            save()


def _save(results: dict[str, Any], out: Path, picture: Path, order: list[str]) -> None:
    """The results written whole (rows in the models' order) and the picture redrawn."""
    rank = {name: i for i, name in enumerate(order)}
    results["simultaneous"].sort(key=lambda r: (rank.get(r["model"], len(rank)), r.get("wait_k") or 0,
                                                r.get("threshold") or 0.5))
    results.get("policy_gap", []).sort(key=lambda r: rank.get(r["model"], len(rank)))
    write_results(out, results, sort_keys=False)
    if results["simultaneous"]:
        plot(results, picture)


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=650,
                        help="Training updates per model (the budget; 650 are about 20 minutes of the cpu "
                             "preset on two cores).")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5, 7, 9],
                        help="Lags of the multi-k model.")
    parser.add_argument("--latency-weights", type=float, nargs="+", default=[0.1, 0.5, 2.0],
                        help="MILk's train.latency_weight, one model each.")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5],
                        help="Stopping thresholds (decode.monotonic_threshold) at which each learned "
                             "policy is decoded: one row each. A later invocation adds the rows of "
                             "thresholds a trained model lacks.")
    parser.add_argument("--threads", type=int, default=1, help="Threads per job.")
    parser.add_argument("--jobs", type=int, default=2, help="Models trained (and streams decoded) at once.")
    parser.add_argument("--single", type=int, default=200,
                        help="Test sentences decoded one at a time for the timing.")
    parser.add_argument("--work", default="runs/simultaneous_multi30k", help="Where the models are trained.")
    parser.add_argument("--out", type=Path, default=RESULTS / "simultaneous_multi30k.json")
    parser.add_argument("--picture", type=Path, default=PICTURE,
                        help="Where the BLEU-against-AL picture goes.")
    parser.add_argument("--part", choices=["all", "simultaneous", "memory"], default="all",
                        help="Only the simultaneous policies or only memory attention.")
    parser.add_argument("--models", nargs="+", metavar="NAME",
                        help="Only these models (of the part chosen), e.g. full multi-k.")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="More settings for every model, e.g. a small test set (data.test_src, "
                             "data.test_tgt) for a quick check of this script.")
    parser.add_argument("--train-only", action="store_true",
                        help="Train the models the results file lacks and stop, writing nothing: trainings "
                             "can then run side by side (a process per core, each with --models) before "
                             "one run scores them.")
    parser.add_argument("--plot", type=Path, metavar="RESULTS_JSON",
                        help="Only draw the picture from a results file.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.plot:
        data = read_results(args.plot)
        if not data.get("simultaneous"):
            raise SystemExit(f"{args.plot}: no simultaneous results to draw")
        plot(data, args.picture)
        print(f"wrote {args.picture}")
        return

    settings = models(args.latency_weights)
    # scaled-dot attention in the memory comparison is the full-sentence model
    memory_names = ["full", *(name for name in settings if name.startswith("memory"))]
    lags = {name: {"multi-k": args.ks, "multi-k-init": args.ks,
                   "wait-3": [3]}.get(name.removesuffix("-long"), [0])
            for name in settings if name not in memory_names[1:]}
    chosen = [name for name in settings
              if args.part == "all" or name == "full"
              or (name in memory_names) == (args.part == "memory")]
    unknown = sorted(set(args.models or []) - set(settings))
    if unknown:
        raise SystemExit(f"--models: no model {', '.join(unknown)}; the models: {', '.join(settings)}")
    chosen = [name for name in chosen if not args.models or name in args.models]

    # A results file of the same budget is continued: the models it holds are kept, the
    # others are trained and scored, and the file is rewritten as each one finishes.
    shared = [*budget(args.steps, checkpoints=CHECKPOINTS), *args.set]
    results: dict[str, Any] = {"benchmark": "simultaneous_multi30k", "budget": shared,
                               "training": {}, "simultaneous": []}
    if args.out.is_file():
        results = read_results(args.out)
        if results.get("budget") != shared:
            raise SystemExit(f"{args.out} holds results of another budget ({results.get('budget')}): "
                             "choose --out or --steps to match")
        results.setdefault("simultaneous", [])
    for name, start in INIT.items():  # entries written before they recorded where they started
        results["training"].get(name, {}).setdefault("init", start)
    results.pop("command", None)  # written before provenance recorded the command
    todo = [name for name in chosen if name not in results["training"]]
    if args.train_only:
        for name in todo:  # in order: a model another starts from comes first
            train(name, settings[name], args)
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        jobs = {pool.submit(model_job, name, settings[name], lags.get(name), args): name for name in todo}
        for job in concurrent.futures.as_completed(jobs):
            entry = job.result()
            results["training"][jobs[job]] = entry["training"]
            results["simultaneous"] += entry["simultaneous"]
            results.setdefault("policy_gap", []).extend(entry["policy_gap"])
            _save(results, args.out, args.picture, list(settings))
    _missing_thresholds(results, [name for name in chosen if learned_policy(name)], args,
                        save=lambda: _save(results, args.out, args.picture, list(settings)))
    gaps = [row["model"] for row in results.get("policy_gap", [])]
    for name in (name for name in chosen if learned_policy(name) and name not in gaps):
        # models scored before this measurement existed
        results.setdefault("policy_gap", []).append(policy_gap(name, args))
        _save(results, args.out, args.picture, list(settings))
    timed = [row["model"] for row in results.get("memory", [])]
    if [name for name in chosen if name in memory_names[1:]] and timed != memory_names:
        # timings one at a time, on a machine doing nothing else, from the trained runs
        results["memory"] = [decode_times(name, args) for name in memory_names]
        results["attention_step"] = attention_step(args)
        results["machine"] = _machine(args)
        _save(results, args.out, args.picture, list(settings))
    print(f"wrote {args.out}" + (f" and {args.picture}" if results["simultaneous"] else ""))
