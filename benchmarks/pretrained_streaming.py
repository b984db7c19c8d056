"""Streaming an imported NLLB-family model on Multi30k, and a causal student distilled from it.

An imported model's encoder reads the whole source, so it streams by encoding the words
read so far again at each read (wait-k over a re-encoding encoder); a student with a
causal encoder, distilled from it, streams incrementally. Each step is a ``seqtrans``
command, as a user runs it:

1. ``--hf DIR``, a Hugging Face M2M-100/NLLB directory; or, by default, one built here: a
   sentencepiece BPE of ``--vocab-size`` pieces trained on Multi30k's training sentences
   (both sides), saved as NLLB's tokenizer by ``transformers.NllbTokenizer`` with the
   codes ``eng_Latn`` and ``deu_Latn``, and an M2M-100 model of the translation task's
   ``cpu`` shape (3 + 3 layers, d 256, FFN 1024, 4 heads; pre-norm, as NLLB) with
   transformers' random initial weights. No pretrained weights are reachable from where
   this was written, so the "fine-tuning" below is the model's whole training;
2. ``seqtrans import hf DIR --out WORK/imported``;
3. the teacher: ``seqtrans run translation --init WORK/imported --preset cpu`` for
   ``--steps`` updates (the budget of ``simultaneous_multi30k``), languages set;
4. ``seqtrans distill`` of the teacher (beam 4, int8) and the student:
   ``seqtrans run translation --vocab WORK/teacher --preset cpu`` with a causal encoder
   trained for every lag at once (``model.multi_k``), on the distilled corpus, the same
   budget;
5. both scored on test2016 as streams (greedy, source words arriving one at a time) at
   wait-k k = 1, 3, 5, 7, 9 and reading the whole source first: BLEU, chrF, the latencies
   as SimulEval computes them (AP, AL, LAAL, DAL, in source words), the fraction equal to
   offline decoding, and the seconds of computation per sentence.

Steps already done in ``--work`` are reused. Results go to
``benchmarks/results/pretrained_streaming.json``; ``python docs/generate.py`` makes the
table of docs/pretrained-families.md from it.

    python -m benchmarks pretrained_streaming --mirror ../shared/data/multi30k

A check that the steps fit together, on a few sentences (its numbers mean nothing):

    python -m benchmarks pretrained_streaming --tiny --steps 60 --work /tmp/ps --out /tmp/ps/r.json \\
        --mirror ../shared/data/multi30k --set data.test_tsv=/tmp/ps/test.tsv
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

import seqtrans
from benchmarks.common import RESULTS, arguments, budget, cpu_info, seqtrans_command, write_results
from seqtrans import tasks
from seqtrans.data.encoding import forced_prefix
from seqtrans.inference import evaluation, loading

OUT = RESULTS / "pretrained_streaming.json"
LANGUAGES = ["decode.source_lang=eng_Latn", "decode.target_lang=deu_Latn"]
CODES = ["eng_Latn", "deu_Latn"]
#: The lags every model is streamed at; 0: the whole source read first.
LAGS = (0, 1, 3, 5, 7, 9)
#: The student: a causal encoder trained for every lag at once (``simultaneous_multi30k``'s
#: ``multi-k``), the teacher's vocabulary and languages.
STUDENT = ["model.causal_encoder=true", "model.multi_k=true"]
#: Students skip the distilled pairs whose longer side has more than 2.5 times the words of
#: the other (the teacher's run-on outputs), as ``distill_multi30k``'s do.
DISTILLED_FILTER = ["data.max_train_ratio=2.5"]
#: --tiny: the student's shape (the teacher's is the imported model's) and the data and budget of both
TINY_MODEL = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
              "model.heads=2"]
TINY = ["data.max_train_examples=300", "train.max_tokens=1000", "train.valid_max_examples=4",
        "decode.max_len_b=10"]
NO_VALIDATION = ["train.eval_every=100000"]


def data_settings(args: argparse.Namespace) -> list[str]:
    mirror = [f"data.mirror={Path(args.mirror).resolve()}"] if args.mirror else []
    return ["data.dataset=multi30k", *mirror, *[s for s in args.overrides if s.startswith("data.")]]


def training_sentences(args: argparse.Namespace) -> list[str]:
    """Multi30k's training sentences, both sides, as the translation task reads them."""
    config = seqtrans.resolve_config("translation", overrides=data_settings(args))
    task = tasks.load("translation")(config.data)
    examples = evaluation.read_split(task, "train").examples
    if args.tiny:
        examples = examples[:300]
    return [e.source for e in examples] + [e.target for e in examples]


def build_hf(directory: Path, args: argparse.Namespace) -> Path:
    """An M2M-100 model of the cpu preset's shape with NLLB's tokenizer, random weights."""
    import sentencepiece as spm
    import transformers

    scratch = directory / "spm"
    scratch.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_sentences(args)), model_writer=buffer,
                                   vocab_size=300 if args.tiny else args.vocab_size, model_type="bpe",
                                   character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    (scratch / "sentencepiece.bpe.model").write_bytes(buffer.getvalue())
    tok = transformers.NllbTokenizer.from_pretrained(scratch, extra_special_tokens=CODES, src_lang=CODES[0],
                                                     tgt_lang=CODES[1])
    tok.save_pretrained(directory)
    (scratch / "sentencepiece.bpe.model").unlink()
    scratch.rmdir()
    width, layers = (32, 1) if args.tiny else (256, 3)
    config = transformers.M2M100Config(
        vocab_size=len(tok), d_model=width, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=4 * width,
        decoder_ffn_dim=4 * width, max_position_embeddings=1024, scale_embedding=True,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.eos_token_id)
    torch.manual_seed(args.seed)
    transformers.M2M100ForConditionalGeneration(config).save_pretrained(directory)
    return directory


def train(out: Path, more: list[str], args: argparse.Namespace) -> Path:
    """``seqtrans run translation --preset cpu`` into ``out`` (unless done): ``more`` are
    its other arguments (``--init`` or ``--vocab`` and settings)."""
    if not (out / "metrics.json").is_file():
        settings = [*budget(args.steps, checkpoints=20), *NO_VALIDATION, *data_settings(args), *LANGUAGES,
                    *(TINY if args.tiny else []), *args.overrides]
        sets = [s for s in more if "=" in s]
        flags = [s for s in more if "=" not in s]
        seqtrans_command("run", "translation", "--preset", "cpu", *flags, "--out", str(out),
                         "--device", "cpu", "--set", *settings, *sets)
    return out


def same_as_offline(loaded: loading.Loaded, split: evaluation.Split, streamed: list[list[int]]) -> float:
    """The fraction of streamed outputs (target ids) equal to offline greedy decoding with
    the same settings, whose outputs start with the forced tokens a stream does not write."""
    forced = len(forced_prefix(loaded.codec))
    _, hyps = loaded.decode([e.source for e in split.examples])
    return sum(s == (h[0].tokens[forced:] if h else []) for s, h in zip(streamed, hyps)) / len(streamed)


def stream(name: str, run: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``run`` scored on test2016 as streams at each lag of :data:`LAGS`."""
    from seqtrans.streaming.evaluation import score_stream

    torch.set_num_threads(args.threads)
    rows = []
    for k in LAGS:
        overrides = ["decode.beam=1", *([f"decode.wait_k={k}"] if k else []), *data_settings(args)]
        loaded = loading.load(run, overrides=overrides, device="cpu")
        split = evaluation.read_split(loaded.task, "test")
        started = time.perf_counter()
        outputs, metrics = score_stream(loaded, split)
        seconds = time.perf_counter() - started
        # a causal encoder's stream is its offline decoding with the lag; a re-encoding one's
        # tokens each see another encoding of the source, which only k = 0 decodes offline
        offline = k == 0 or name != "teacher"
        same = same_as_offline(loaded, split, [o.tokens for o in outputs]) if offline else None
        rows.append({"model": name, "wait_k": k or None, **metrics, "same_as_offline": same,
                     "ms_per_sentence": round(1000 * seconds / len(split.examples), 2),
                     "sentences": len(split.examples)})
        print(f"{name:>8} k={k or '-':>2}: BLEU {metrics['bleu']:.2f}  AL {metrics['stream_al']:.2f}  "
              f"LAAL {metrics['stream_laal']:.2f}  {rows[-1]['ms_per_sentence']} ms/sentence", flush=True)
    return rows


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--hf", type=Path, help="A Hugging Face M2M-100/NLLB directory to start from "
                                                "(default: one built here with random weights).")
    parser.add_argument("--work", type=Path, default=Path("runs/pretrained-streaming"),
                        help="Where the model directories, runs and corpus go.")
    parser.add_argument("--mirror", help="A directory holding the Multi30k files (data.mirror).")
    parser.add_argument("--steps", type=int, default=650, help="Updates of the teacher and of the student.")
    parser.add_argument("--vocab-size", type=int, default=8000, help="Pieces of the tokenizer built here.")
    parser.add_argument("--seed", type=int, default=1, help="Seed of the random initial weights.")
    parser.add_argument("--threads", type=int, default=2, help="Threads of the streaming (default 2).")
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="Settings of every run and decoding (data.test_tsv=FILE: a small test set).")
    parser.add_argument("--tiny", action="store_true", help="Tiny models on 300 pairs: checks the steps fit.")
    parser.add_argument("--out", type=Path, default=OUT, help="The results JSON.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    hf = args.hf
    if hf is None:
        hf = args.work / "hf"
        if not (hf / "model.safetensors").is_file():
            build_hf(hf, args)
    imported = args.work / "imported"
    if not imported.is_dir():
        seqtrans_command("import", "hf", str(hf), "--out", str(imported))
    teacher = train(args.work / "teacher", ["--init", str(imported), "model.dropout=0.1"], args)
    corpus = args.work / "distilled"
    if not corpus.is_dir():
        seqtrans_command("distill", str(teacher), "--out", str(corpus), "--set", "decode.beam=4",
                         "decode.precision=int8", *data_settings(args))
    distilled = json.loads((corpus / "distill.json").read_text(encoding="utf-8"))
    files = list(distilled["student_overrides"])  # the corpus's files, as the task reads them
    student = train(args.work / "student", ["--vocab", str(teacher), *STUDENT, *files,
                                            *(TINY_MODEL if args.tiny else []),
                                            *([] if args.tiny else DISTILLED_FILTER)], args)
    rows = stream("teacher", teacher, args) + stream("student", student, args)
    minutes = {name: json.loads((run / "metrics.json").read_text()).get("train_minutes")
               for name, run in (("teacher", teacher), ("student", student))}
    write_results(args.out, {
        "start": str(args.hf) if args.hf else "built here: M2M-100 (NLLB tokenizer), random weights",
        "steps": args.steps, "student_settings": STUDENT, "train_minutes": minutes,
        "distilled_pairs": distilled["pairs"],
        "rows": rows, "machine": {"processor": cpu_info()["model"], "threads": args.threads,
                                  "torch": torch.__version__},
    })
    print(f"wrote {args.out}")

