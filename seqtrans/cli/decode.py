"""Commands that decode with a trained model: ``predict``, ``evaluate``, ``score``,
``attention`` and ``shortlist`` (the vocabulary shortlist decoding may use). Each spec
sits beside its handler; the work is the inference modules'."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqtrans.cli.arguments import (
    BEAM,
    DECODE_SET,
    DEVICE,
    MODEL,
    MODELS,
    Command,
    arg,
    finite_float,
    progress,
)
from seqtrans.errors import UsageError
from seqtrans.runtime import atomic

# predict's and evaluate's shortcuts for decode.* keys: (flag, key, type); the help is the key's own
SAMPLING_FLAGS = (("--sample", "sample", int), ("--temperature", "temperature", finite_float),
                  ("--top-k", "top_k", int), ("--top-p", "top_p", finite_float),
                  ("--epsilon", "epsilon", finite_float),
                  ("--seed", "seed", int))


def _decode_help(key: str) -> str:
    from dataclasses import fields

    from seqtrans.config import DecodeConfig

    return str(next(f.metadata["help"] for f in fields(DecodeConfig) if f.name == key))


def _decode_overrides(args: argparse.Namespace) -> list[str]:
    """The --set overrides with those of --beam and the sampling flags added."""
    overrides = list(args.overrides)
    if args.beam is not None:
        if args.stream and args.beam != 1:
            raise UsageError("--stream decodes greedily; it takes no --beam")
        overrides.append(f"decode.beam={args.beam}")
    for _flag, key, _kind in SAMPLING_FLAGS:
        value = getattr(args, key)
        if value is not None:
            overrides.append(f"decode.{key}={value}")
    return overrides


def _write_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _stdin_chunks() -> Iterator[str]:
    """Standard input as it arrives: whatever a read returns, without waiting for a full
    line or buffer (a file stream without a descriptor is read line by line)."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        yield from sys.stdin
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(fd, 1 << 16):
        yield decoder.decode(chunk)
    yield decoder.decode(b"", final=True)


def _cmd_predict(args: argparse.Namespace) -> int:
    from seqtrans.inference.lexical import ConstraintLines
    from seqtrans.inference.loading import load_ensemble
    from seqtrans.inference.online import line_batches, predict, predict_batches
    from seqtrans.inference.output import OutputOptions
    from seqtrans.streaming.predict import stream, words_of
    from seqtrans.tasks.protocol import stream_unit

    overrides = _decode_overrides(args)
    loaded = load_ensemble(args.models, overrides=overrides, device=args.device)
    if args.stream:
        if (args.prefixes or args.constraints or args.format != "text" or args.token_scores
                or args.alignments):
            raise UsageError("--stream writes text only: it takes no --prefixes, --constraints, --format "
                             "jsonl, --token-scores or --alignments")
        stream(loaded, words_of(_stdin_chunks(), unit=stream_unit(loaded.task)), _write_now)
        return 0
    if args.alignment_layer is not None and not args.alignments:
        raise UsageError("--alignment-layer needs --alignments")
    output = OutputOptions(format=args.format, token_log_probs=args.token_scores, alignments=args.alignments,
                           alignment_layer=args.alignment_layer)
    with contextlib.ExitStack() as files:
        constraints = None
        if args.constraints is not None:
            try:
                lines = files.enter_context(args.constraints.open(encoding="utf-8"))
            except OSError as exc:
                raise UsageError(f"--constraints {args.constraints}: {exc.strerror}") from None
            constraints = ConstraintLines(lines, str(args.constraints))
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):  # a stream without a descriptor
            outputs = predict(loaded, sys.stdin, prefixes=args.prefixes, output=output,
                              constraints=constraints)
        else:
            outputs = predict_batches(loaded, line_batches(fd), prefixes=args.prefixes, output=output,
                                      constraints=constraints)
        for line in outputs:
            _write_now(line + "\n")
    return 0


PREDICT = Command(
    "predict", "Decode lines from stdin with a trained model.",
    "Read inputs from stdin, one per line, and write the outputs to "
    "stdout in input order. Lines that have arrived are decoded together "
    "(up to 1,000 at a time, sorted by length into batches of "
    "decode.batch_tokens), so a file decodes at batch speed, while a "
    "line typed at a terminal is answered at once.",
    (MODELS, BEAM,
     arg("--stream", action="store_true",
         help="Simultaneous decoding: read each input word by word (character by "
              "character for a task whose stream_unit is characters) as it arrives on "
              "stdin, write each target token as soon as it is decided, and end each "
              "output with a tab and the delays (the source tokens read when each target "
              "token was written). Greedy; needs a model that decides when to read: wait-k "
              "(model.wait_k, or decode.wait_k for any scaled_dot model; without a lag it "
              "reads the whole input first; an encoder that is not causal encodes the input "
              "read so far again at each read), or model.cross_attention=monotonic, milk, "
              "mocha, mma_hard, mma_il or mma_chunk with model.causal_encoder=true."),
     *(arg(flag, type=kind, metavar=key.upper(), help=f"decode.{key}: {_decode_help(key)}")
       for flag, key, kind in SAMPLING_FLAGS),
     arg("--prefixes", action="store_true",
         help="Each input line is SOURCE<TAB>PREFIX: the output starts with PREFIX (read as the "
              "task reads a target, e.g. text for translation), which is scored, not searched, and "
              "decoding goes on after it (interactive translation). A line without a tab has no "
              "prefix. A prefix the task cannot read or whose tokens the model's vocabulary lacks "
              "is an error naming the line; that line's output is left empty, the other lines "
              "are decoded, and the exit status is 1."),
     arg("--constraints", metavar="FILE", type=Path,
         help="Lexical constraints, line by line with the input: each line of FILE a JSON object "
              "{\"required\": [PHRASE, ...], \"banned\": [PHRASE, ...]} (either key may be left out; "
              "an empty line has none), each phrase read as the task reads a target. Every output "
              "contains each required phrase (as often as it is listed), found by beam search with "
              "dynamic beam allocation, also at --beam 1; a line's required tokens may not exceed "
              "decode.beam or its maximum output length. No output contains a banned phrase. A line "
              "of FILE that cannot be read or searched is an error naming FILE and the line; that "
              "input's output is left empty, the other lines are decoded, and the exit status is 1. "
              "Required phrases cannot be sampled (--sample)."),
     arg("--format", choices=["text", "jsonl"], default="text",
         help="text: one line per output (with nbest or sample > 1: rank, score and output, "
              "tab-separated, and an empty line after each input); jsonl: one JSON object per input "
              "with its line number and its hypotheses (output, tokens, log_prob, score, "
              "normalized_score and the fields asked for below; a line that could not be decoded "
              "has an 'error')."),
     arg("--token-scores", action="store_true",
         help="Add each output token's log-probability and the end symbol's (a tab-separated column "
              "in text, 'token_log_probs' in jsonl), from one teacher-forced pass over the outputs."),
     arg("--alignments", action="store_true",
         help="Add source-target word alignments in Pharaoh format (i-j: source word i, target word "
              "j, from 0) from the encoder-decoder attention: each target token with the source "
              "token it attends to most (a tab-separated column in text, 'alignment' in jsonl)."),
     arg("--alignment-layer", type=int, metavar="N",
         help="With --alignments: the attention of decoder layer N (from 1) instead of the mean of "
              "all layers; heads are averaged."),
     DECODE_SET, DEVICE),
    handler=_cmd_predict,
)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from seqtrans.inference.loading import evaluate

    overrides = _decode_overrides(args)
    for flag, value in (("--output", args.output), ("--instances", args.instances)):
        if value is not None and not args.stream:
            raise UsageError(f"{flag} is for --stream (evaluate otherwise prints its metrics only)")
    metrics = evaluate(args.models, split=args.split, overrides=overrides, device=args.device,
                       progress=progress(args), stream=args.stream, instances=args.instances)
    if args.stream:
        from seqtrans.streaming.evaluation import metrics_path

        path = args.output or metrics_path(args.models[0], split=args.split, overrides=args.overrides)
        atomic.write_json(path, metrics)
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


EVALUATE = Command(
    "evaluate", "Decode and score a split with a trained model.",
    "Decode one split of the model's task and print its metrics as JSON.",
    (MODELS, arg("--split", default="test", choices=["train", "dev", "test"]), BEAM,
     arg("--stream", action="store_true",
         help="Simultaneous decoding: feed each source word by word to one model, greedily, "
              "as 'predict --stream' does, and add the latency in source words as SimulEval "
              "1.1.4 computes it, each output word delayed until a reader knows it is complete "
              "(stream_ap, stream_al, stream_laal, stream_dal; with the delays of each word's "
              "last piece, stream_piece_*; see docs/streaming.md). Also writes the metrics to "
              "RUN_DIR/metrics-stream-SPLIT.json, the --set settings in the name "
              "(metrics-stream-test.wait_k=3.json), or to --output. Needs a model that can "
              "stream: scaled_dot attention under wait-k (any encoder), or a learned policy "
              "(monotonic, milk, mocha, mma_hard, mma_il, mma_chunk) with model.causal_encoder=true."),
     arg("--output", metavar="FILE", type=Path,
         help="With --stream: write the metrics here instead."),
     arg("--instances", metavar="FILE", type=Path,
         help="With --stream: write each sentence's output and delays to FILE, one JSON line "
              "each, in the form of SimulEval's instances.log."),
     *(arg(flag, type=kind, metavar=key.upper(), help=f"decode.{key}: {_decode_help(key)}")
       for flag, key, kind in SAMPLING_FLAGS),
     DECODE_SET, DEVICE),
    handler=_cmd_evaluate,
)


def _cmd_score(args: argparse.Namespace) -> int:
    from seqtrans.inference.loading import load_ensemble
    from seqtrans.inference.scoring import format_score, score_files

    loaded = load_ensemble(args.models, overrides=args.overrides, device=args.device)
    scores = score_files(loaded, args.src, args.tgt, progress=progress(args))
    alpha = loaded.config.decode.alpha if args.normalize else None
    kind = loaded.config.decode.length_penalty
    text = "".join(format_score(s, alpha=alpha, kind=kind) + "\n" for s in scores)
    if args.out is None:
        sys.stdout.write(text)
    else:
        atomic.write_text(args.out, text)  # a failed run leaves no half-written scores
    return 0


SCORE = Command(
    "score", "Print the log-probability of given source-target pairs.",
    "Score the line pairs of --src and --tgt (the task reads and encodes "
    "each side) by teacher forcing, in batches of decode.batch_tokens "
    "sorted by length, and write one line per pair in input order: the "
    "total log-probability of the target with its end symbol, the mean "
    "per token, and the number of tokens, tab-separated. For reranking "
    "and filtering. Several runs score as an ensemble.",
    (MODELS,
     arg("--src", required=True, metavar="FILE", type=Path, help="Sources, one per line."),
     arg("--tgt", required=True, metavar="FILE", type=Path,
         help="Targets, one per line, line by line with --src."),
     arg("--out", metavar="FILE", type=Path, help="Write the scores here instead of stdout."),
     arg("--normalize", action="store_true",
         help="First column: the total divided by the length penalty with the run's "
              "decode.alpha, the score beam search ranks by."),
     DECODE_SET, DEVICE),
    handler=_cmd_score,
)


def _cmd_attention(args: argparse.Namespace) -> int:
    from seqtrans.inference.heatmaps import attend, draw
    from seqtrans.inference.loading import load, run_directory

    overrides = [f"decode.beam={args.beam}"] if args.beam is not None else []
    loaded = load(args.model, overrides=overrides, device=args.device)
    given = Path(args.model)
    # a checkpoint in RUN/checkpoints/ draws into RUN/attention, beside the run's other outputs
    out = args.out or (given if given.is_dir() else run_directory(given)) / "attention"
    for path in draw(attend(loaded, args.input, target=args.target), out, layers=args.layers):
        print(f"wrote {path}")
    return 0


ATTENTION = Command(
    "attention", "Draw a trained model's attention on one input as PNGs.",
    "Decode INPUT with the run's decoding settings (or take --target), "
    "run the model on it once more asking for its attention weights, and "
    "write heatmaps: OUT/encoder.png (encoder self-attention), "
    "OUT/decoder.png (decoder self-attention) and OUT/cross.png "
    "(encoder-decoder attention; for memory attention the K contexts, "
    "for monotonic attention the alignment), each a grid of layers by "
    "heads with the tokens as labels. Needs matplotlib "
    "(pip install 'seqtrans[plot]').",
    (MODEL,
     arg("input", metavar="INPUT", help="One input, as a line given to 'seqtrans predict'."),
     arg("--target", metavar="TOKENS",
         help="Draw the attention on this target instead of the model's output: its tokens "
              "separated by spaces, as in the model's target vocabulary (subword pieces for "
              "a subword task)."),
     arg("--out", metavar="DIR", type=Path,
         help="Where to write the PNGs (default: RUN_DIR/attention)."),
     arg("--layers", nargs="+", type=int, metavar="N",
         help="Draw only these layers of each stack, counted from 1 (default: all)."),
     BEAM, DEVICE),
    handler=_cmd_attention,
)


def _shortlist_fields() -> tuple[Any, ...]:
    from dataclasses import fields

    from seqtrans.shortlist.table import ShortlistSettings

    return fields(ShortlistSettings)


def _cmd_shortlist(args: argparse.Namespace) -> int:
    from seqtrans.shortlist.build import build_shortlist
    from seqtrans.shortlist.table import ShortlistSettings

    settings = ShortlistSettings(**{f.name: getattr(args, f.name) for f in _shortlist_fields()})
    if (args.source is None) != (args.target is None):
        raise UsageError("--source and --target name the two sides of the same pairs: give both or neither")
    pairs = None if args.source is None else (args.source, args.target)
    path = build_shortlist(args.model, settings=settings, progress=progress(args), pairs=pairs,
                           overrides=args.overrides)
    print(f"wrote {path}")
    return 0


SHORTLIST = Command(
    "shortlist", "Build a run's vocabulary shortlist from its training data (decode.shortlist).",
    "Count which target tokens go with each source token in the run's training pairs (IBM "
    "Model 1's translation table, by expectation-maximisation), keep the best of each and "
    "the most frequent target tokens, and write RUN_DIR/shortlist.npz with the digest of "
    "the run's vocabulary files (a shortlist of another vocabulary is refused when it "
    "loads). Decoding with decode.shortlist=true then computes the output projection only "
    "over the tokens a batch's sources may produce. 'export --to ctranslate2' carries it as "
    "CTranslate2's vocabulary map. With --source and --target, the pairs are counted from "
    "those files instead: an imported model has no training data of its own. See docs/speed.md.",
    (MODEL,
     arg("--source", metavar="FILE", help="Source side of parallel text to count, one sentence a line "
         "(with --target; default: the run's training data)."),
     arg("--target", metavar="FILE", help="Target side of the same pairs, line for line."),
     arg("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
         help="Override decode.* or data.* keys as the pairs are read, e.g. a multilingual "
              "model's decode.source_lang and decode.target_lang."),
     *(arg("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
           metavar="N", help=f.metadata["help"]) for f in _shortlist_fields())),
    handler=_cmd_shortlist,
)
