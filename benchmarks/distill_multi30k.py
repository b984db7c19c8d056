"""Fast students on Multi30k en-de against CTranslate2 int8 decoding the teacher.

Sequence-level distillation, deep-encoder/shallow-decoder students and vocabulary
shortlists, against CTranslate2 int8 decoding the teacher.

1. teacher: the translation task's ``cpu`` preset, ``--steps`` updates (or ``--teacher RUN``,
   a run trained before, reused as it is);
2. distillation: the teacher's outputs for its training sources (``seqtrans distill``,
   beam 4, batched, int8), written once into ``--work``;
3. students: the ``student`` preset (6 encoder / 2 decoder layers), ``student-tiny``
   (6 and 1, narrower) and the teacher's shape with one decoder layer
   (``cpu-1-decoder``), each with the teacher's
   ``model.causal_encoder``, trained on the distilled corpus (less its run-on pairs,
   :data:`DISTILLED_FILTER`) with the teacher's vocabulary, the same budget each, and
   each run's shortlist (``seqtrans shortlist``);
4. each model's length penalty chosen on the dev set (:data:`ALPHAS`), then decoding
   test2016 at int8 with each model as ``predict`` decodes a file (batches of
   ``decode.batch_tokens`` sorted by length), with beam 4 and greedily (:data:`BEAMS`),
   the students with and without their shortlist: test BLEU, target tokens/s (output pieces without the end
   symbol, over the whole decoding) and the median latency of one sentence decoded alone,
   with freed memory kept for reuse as the ``seqtrans`` command keeps it;
   CTranslate2 int8 decoding the exported teacher (beam 4, the same batches) in the same run;
   a teacher CTranslate2 cannot run (a causal encoder) is replaced there by ``--ct2-teacher``,
   a stand-in that seqtrans decodes too.

Results go to ``benchmarks/results/distill_multi30k.json`` through ``write_results``;
``python docs/generate.py`` then makes the table and the BLEU-against-speed picture of
docs/speed.md. Runs already in ``--work`` are reused.

    python -m benchmarks distill_multi30k --steps 3000 --threads 1 --mirror ../shared/data/multi30k

``--train-only`` stops after the training, so that the trainings can share the machine
with other work and the same command without it measures later, on a machine doing nothing
else. Decoding that is timed runs at ``--threads``; training uses every core.

A check that the steps fit together, on a few sentences (its numbers mean nothing):

    python -m benchmarks distill_multi30k --steps 4 --work /tmp/d --out /tmp/d/r.json \\
        --mirror ../shared/data/multi30k --tiny --set data.test_tsv=/tmp/d/test.tsv
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import seqtrans
from benchmarks.common import RESULTS, arguments, budget, cpu_info, write_results
from seqtrans import pipeline
from seqtrans.errors import ConfigError
from seqtrans.inference import evaluation, loading
from seqtrans.inference.distill import distill
from seqtrans.inference.export import export
from seqtrans.runtime import environment
from seqtrans.runtime.system import keep_freed_memory
from seqtrans.runtime.threads import set_threads
from seqtrans.shortlist.build import build_shortlist
from seqtrans.shortlist.table import FILE as SHORTLIST

OUT = RESULTS / "distill_multi30k.json"
#: The students: name -> (preset, settings beyond it): the ``student`` preset, and the
#: teacher's own shape with one decoder layer instead of three (its encoder as the
#: teacher's, only the decoder shallower) and, as the student presets, an output layer of
#: its own (``presets.py`` says why). Each takes the teacher's
#: ``model.causal_encoder`` (:func:`teacher_settings`): at this budget's learning rate the
#: post-norm encoder without it collapsed (every position the same output), and the student
#: learned a language model of the distilled targets (docs/speed.md).
STUDENTS: dict[str, tuple[str, list[str]]] = {
    "student": ("student", []),
    "student-tiny": ("student-tiny", []),
    "cpu-1-decoder": ("cpu", ["model.decoder_layers=1", "model.tie_output=false"]),
}
#: Students skip the distilled pairs one side of which has more than 2.5 times the words of
#: the other: the teacher's run-on outputs (a phrase repeated up to the length limit), which
#: students learned to repeat. 384 of the 29,000 distilled pairs, 6 of the original ones.
DISTILLED_FILTER = ["data.max_train_ratio=2.5"]
#: Length penalties tried on the dev set for each model, the best decoding test: the
#: paper's 0.6 and the ``cpu`` preset's 1.4 (tuned for its own 30-minute model).
ALPHAS = (0.6, 1.0, 1.4)
TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "data.vocab_size=600", "data.max_train_examples=300", "train.max_tokens=1000",
        "train.valid_max_examples=4", "decode.max_len_b=10"]
LATENCY_SENTENCES = 100
#: Every model is scored once, after training, not validated on the way.
NO_VALIDATION = ["train.eval_every=100000"]
#: Every student decodes with beam 4, as the teacher does, and greedily: a student trained on
#: its teacher's beam outputs has learned the mode the beam finds, so greedy search loses it
#: little (Kim and Rush 2016, section 6), which is how distilled students are deployed.
BEAMS = (4, 1)


def teacher_settings(teacher: Path) -> list[str]:
    """The teacher's model settings a student keeps: whether its encoder is causal."""
    saved = json.loads((teacher / "config.json").read_text(encoding="utf-8"))
    return [f"model.causal_encoder={str(bool(saved['model'].get('causal_encoder'))).lower()}"]


def settings(args: argparse.Namespace) -> list[str]:
    """The settings of every run and decoding: the data source and the user's --set."""
    out = [f"data.mirror={Path(args.mirror).resolve()}"] if args.mirror else []
    return [*out, *(TINY if args.tiny else []), *args.overrides]


def data_settings(args: argparse.Namespace) -> list[str]:
    return [s for s in settings(args) if s.startswith("data.") and not s.startswith("data.max_train")]


def train(name: str, preset: str, overrides: list[str], args: argparse.Namespace, *,
          vocabulary: Path | None = None) -> Path:
    """Train one model into ``--work`` (unless it is there already); its run directory."""
    out = Path(args.work) / name
    if not (out / "metrics.json").is_file():
        config = seqtrans.resolve_config("translation", preset=preset,
                                         overrides=[*budget(args.steps, average_last=None), *NO_VALIDATION,
                                                    *settings(args), *overrides])
        given = seqtrans.vocabulary_of(vocabulary, config) if vocabulary is not None else None
        started = time.perf_counter()
        pipeline.run(config, out, device="cpu", progress=True, vocabulary=given)
        logging.info("%s trained in %.1f minutes", name, (time.perf_counter() - started) / 60)
    return out


def tune_alpha(run: Path, args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """The length penalty of :data:`ALPHAS` with the best dev BLEU at int8, and each one's."""
    scores = {}
    for alpha in ALPHAS:
        decoding = ["decode.precision=int8", f"decode.alpha={alpha}", *data_settings(args)]
        loaded = loading.load(run, device="cpu", overrides=decoding)
        examples = evaluation.read_split(loaded.task, "dev").examples
        predictions, _ = loaded.decode([e.source for e in examples])
        scores[str(alpha)] = round(float(loaded.task.score(predictions, examples)["bleu"]), 2)
    best = max(ALPHAS, key=lambda a: scores[str(a)])
    logging.info("%s: dev BLEU by alpha %s", run.name, scores)
    return best, scores


def measure(run: Path, args: argparse.Namespace, *, shortlist: bool, alpha: float,
            beam: int = 4) -> dict[str, Any]:
    """Test BLEU, target tokens/s over the whole test set and one sentence's median latency,
    decoding at int8 (with or without the run's shortlist) with length penalty ``alpha``."""
    decoding = ["decode.precision=int8", f"decode.shortlist={shortlist}", f"decode.alpha={alpha}",
                f"decode.beam={beam}", *data_settings(args)]
    loaded = loading.load(run, device="cpu", overrides=decoding)
    examples = evaluation.read_split(loaded.task, "test").examples
    sources = [e.source for e in examples]
    loaded.decode(sources[:8])  # the int8 copy and the native kernels made outside the timing
    started = time.perf_counter()
    predictions, hyps = loaded.decode(sources)
    seconds = time.perf_counter() - started
    tokens = sum(len(h[0].tokens) for h in hyps if h)
    latency = []
    for source in sources[:LATENCY_SENTENCES]:
        started = time.perf_counter()
        loaded.decode([source])
        latency.append(time.perf_counter() - started)
    scores = loaded.task.score(predictions, examples)
    return {"bleu": round(float(scores["bleu"]), 2), "int8_tokens_per_s": round(tokens / seconds, 1),
            "latency_ms": round(1000 * statistics.median(latency), 2), "sentences": len(sources),
            "beam": loaded.config.decode.beam, "alpha": alpha}


def ctranslate2_teacher(teacher: Path, args: argparse.Namespace) -> dict[str, Any]:
    """CTranslate2 int8 decoding the exported teacher: test BLEU and target tokens/s, beam 4,
    batches of the run's decode.batch_tokens (source tokens) sorted by length."""
    import ctranslate2

    exported = Path(args.work) / f"{teacher.name}-ct2"
    if not exported.is_dir():
        export(teacher, to="ctranslate2", out=exported, quantization="int8")
    loaded = loading.load(teacher, device="cpu", overrides=data_settings(args))
    examples = evaluation.read_split(loaded.task, "test").examples
    tokens_in = [loaded.codec.source_tokens(e.source) for e in examples]
    translator = ctranslate2.Translator(str(exported), device="cpu", compute_type="int8", inter_threads=1,
                                        intra_threads=torch.get_num_threads())
    options = dict(beam_size=4, max_batch_size=loaded.config.decode.batch_tokens, batch_type="tokens",
                   max_decoding_length=int(loaded.config.decode.max_len_b) + max(map(len, tokens_in)),
                   suppress_sequences=[["<pad>"], ["<s>"]])
    translator.translate_batch(tokens_in[:8], **options)
    started = time.perf_counter()
    results = translator.translate_batch(tokens_in, **options)
    seconds = time.perf_counter() - started
    outputs = [r.hypotheses[0] for r in results]
    predictions = [loaded.codec.prediction(o, e.source) for o, e in zip(outputs, examples)]
    return {"bleu": round(float(loaded.task.score(predictions, examples)["bleu"]), 2),
            "int8_tokens_per_s": round(sum(map(len, outputs)) / seconds, 1),
            "ctranslate2": ctranslate2.__version__}


def machine(args: argparse.Namespace) -> dict[str, Any]:
    return {"processor": cpu_info()["model"], "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=3000, help="Updates of every model (default 3000).")
    parser.add_argument("--work", default="runs/distill", help="Where the runs and the corpus go.")
    parser.add_argument("--teacher", type=Path, help="Reuse this trained translation run as the teacher.")
    parser.add_argument("--mirror", help="A directory holding the Multi30k files (data.mirror).")
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="Settings of every run and decoding (data.test_tsv=FILE: a small test set).")
    parser.add_argument("--threads", type=int, default=1, help="Threads of every decoding (default 1).")
    parser.add_argument("--tiny", action="store_true", help="Tiny models on 300 pairs: checks the steps fit.")
    parser.add_argument("--out", type=Path, default=OUT, help="The results JSON.")
    parser.add_argument("--students", nargs="+", choices=sorted(STUDENTS), default=list(STUDENTS),
                        help="Train and measure only these students (default: all).")
    parser.add_argument("--ct2-teacher", type=Path, metavar="RUN",
                        help="Where the teacher cannot be exported (a causal encoder: CTranslate2's is "
                             "bidirectional), the run CTranslate2 decodes instead: one of the teacher's "
                             "shape, budget and vocabulary with a bidirectional encoder. seqtrans int8 "
                             "decodes it too, in the same run, for the ratio.")
    parser.add_argument("--train-only", action="store_true",
                        help="Train the teacher, the corpus and the students and stop: a later run "
                             "reuses them and measures, on a machine doing nothing else.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    teacher = args.teacher or train("teacher", "cpu", [], args)
    corpus = distill(teacher, work / "distilled", overrides=["decode.beam=4", "decode.precision=int8"],
                     progress=True)
    # Training uses every core; only the decoding that is timed runs at --threads.
    # (a --tiny teacher's outputs are all run-on: nothing would be left to train on)
    keep = [*corpus.overrides, *([] if args.tiny else DISTILLED_FILTER), *teacher_settings(teacher)]
    runs = {name: train(name, preset, [*keep, *more], args, vocabulary=teacher)
            for name, (preset, more) in STUDENTS.items() if name in args.students}
    if args.train_only:
        return
    set_threads(args.threads)
    # as the seqtrans command keeps freed memory (SEQTRANS_MALLOC), so that the timings are
    # predict's; CTranslate2 has an allocator of its own
    kept = environment.malloc() == "keep" and keep_freed_memory()
    students = []
    for name, run in runs.items():
        if not (run / SHORTLIST).is_file():
            build_shortlist(run)
        alpha, dev = tune_alpha(run, args)
        for beam in BEAMS:
            for shortlist in (False, True):
                measured = measure(run, args, shortlist=shortlist, alpha=alpha, beam=beam)
                students.append({"name": name, "shortlist": shortlist, **measured, "dev_bleu_by_alpha": dev})
    alpha, dev = tune_alpha(teacher, args)
    results = {"teacher": {**measure(teacher, args, shortlist=False, alpha=alpha), "dev_bleu_by_alpha": dev},
               # what greedy search costs the teacher, beside what it costs the students
               "teacher_greedy": measure(teacher, args, shortlist=False, alpha=alpha, beam=1),
               "students": students, "steps": args.steps, "distilled_pairs": corpus.pairs,
               "machine": machine(args), "freed_memory_kept": kept}
    try:
        ct2 = ctranslate2_teacher(args.ct2_teacher or teacher, args)
    except ConfigError as exc:  # a model CTranslate2 cannot run (a causal encoder): said, not hidden
        ct2 = {"int8_tokens_per_s": None, "not_run": str(exc)}
    if args.ct2_teacher is not None:  # the stand-in, as seqtrans decodes it
        alpha, dev = tune_alpha(args.ct2_teacher, args)
        ct2["run"] = args.ct2_teacher.name
        ct2["seqtrans_int8"] = {**measure(args.ct2_teacher, args, shortlist=False, alpha=alpha),
                                "dev_bleu_by_alpha": dev}
    results["ct2_int8_teacher_tokens_per_s"] = ct2["int8_tokens_per_s"]
    results["ct2_int8_teacher"] = ct2
    print(json.dumps(results, indent=2))
    write_results(args.out, results)
    print(f"wrote {args.out}")
