"""The ``seqtrans`` command line.

Exit status: 0 on success, 2 on usage or configuration errors, 1 on data or
checkpoint errors (a one-line message naming the file and line).

Plugins may add commands through the ``seqtrans.commands`` entry-point group: the
entry point names a callable ``main(argv: list[str]) -> int`` that parses its own
arguments; ``seqtrans NAME ARGS...`` calls it with ``ARGS``.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans import __version__
from seqtrans.errors import Interrupted, SeqtransError, UsageError
from seqtrans.inference.export import FORMATS as EXPORT_FORMATS
from seqtrans.inference.export import QUANTIZATIONS as EXPORT_QUANTIZATIONS
from seqtrans.runtime import atomic, environment
from seqtrans.runtime.system import keep_freed_memory
from seqtrans.runtime.threads import parse_threads, parse_wait_policy, set_threads, set_wait_policy
from seqtrans.tasks.discovery import COMMAND_GROUP, TaskEntry, installed, load_object

MODELS_HELP = ("A run directory or checkpoint; several (of one vocabulary) decode as an ensemble that "
               "averages their log-probabilities at each step, with the first one's task and decoding "
               "settings.")
SET_HELP = ("Override config keys, dotted: --set model.d_model=256 train.max_minutes=5. "
            "Takes several pairs and may be repeated; values are cast to the key's type. "
            "'seqtrans config TASK' lists every key with its help.")


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: the argument's names and its settings."""

    names: tuple[str, ...]
    settings: Mapping[str, Any]


def arg(*names: str, **settings: Any) -> Arg:
    return Arg(names, settings)


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, its description and its arguments, in order."""

    name: str
    help: str
    description: str
    args: tuple[Arg, ...] = ()


CONFIG_ARGS = (
    arg("task", help="Task name (see 'seqtrans tasks')."),
    arg("--preset", help="A named preset of the task (or 'base', 'big')."),
    arg("--config", dest="config_file", metavar="FILE",
        help="A JSON or TOML file of config sections, e.g. a run's config.json."),
    arg("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help=SET_HELP),
)
DEVICE = arg("--device", default="auto", choices=["auto", "cpu", "cuda"],
             help="Where to run: cuda if available (auto), or as named.")
MODELS = arg("models", nargs="+", metavar="RUN_DIR_OR_CHECKPOINT", help=MODELS_HELP)
MODEL = arg("model", metavar="RUN_DIR_OR_CHECKPOINT")
DECODE_SET = arg("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                 help="Override decode.* (or data.*) keys.")
BEAM = arg("--beam", type=int, help="Beam size (default: the run's decode.beam).")
# predict's and evaluate's shortcuts for decode.* keys: (flag, key, type); the help is the key's own
SAMPLING_FLAGS = (("--sample", "sample", int), ("--temperature", "temperature", float),
                  ("--top-k", "top_k", int), ("--top-p", "top_p", float), ("--epsilon", "epsilon", float),
                  ("--seed", "seed", int))

def _threads(text: str) -> int:
    try:
        return parse_threads(text, name="--threads")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers(text: str) -> int:
    try:
        return parse_threads(text, name="--workers")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("threads", "workers")) from None


def _wait_policy(text: str) -> str:
    try:
        return parse_wait_policy(text, name="--wait-policy")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


GLOBAL_ARGS = (
    arg("-q", "--quiet", action="store_true", help="Log warnings only, no progress bars."),
    arg("--threads", type=_threads, metavar="N",
        help="Threads each process computes with (PyTorch's and the native kernels'). Default: "
             "$SEQTRANS_THREADS, else $OMP_NUM_THREADS if set, else the CPUs this process may use "
             "(its CPU affinity and its cgroup's CPU quota, not the host's cores). With 'serve "
             "--workers W', each worker's. See docs/speed.md."),
    arg("--wait-policy", type=_wait_policy, metavar="POLICY",
        help="How OpenMP's idle threads wait for work: active (spin), passive (sleep at once), a spin "
             "count N (spin about N times, then sleep), or default (OpenMP's own, or what "
             "$OMP_WAIT_POLICY and $GOMP_SPINCOUNT say). Default: $SEQTRANS_WAIT_POLICY, else what "
             "$OMP_WAIT_POLICY or $GOMP_SPINCOUNT say, else passive: spinning threads hold cores that "
             "other busy processes want (measured: docs/speed.md)."),
    arg("--progress", choices=["auto", "on", "off"], default="auto",
        help="Progress bars (training's shows updates or minutes, loss, lr, tokens/s and "
             "the time left, in place of the per-update log lines on the console, which "
             "the run's log file still gets): auto shows them when standard error is a "
             "terminal and -q is not given; on and off force either."),
)

def _decode_help(key: str) -> str:
    from dataclasses import fields

    from seqtrans.config import DecodeConfig

    return str(next(f.metadata["help"] for f in fields(DecodeConfig) if f.name == key))


def _shortlist_fields() -> tuple[Any, ...]:
    from dataclasses import fields

    from seqtrans.shortlist.table import ShortlistSettings

    return fields(ShortlistSettings)


def _serve_fields() -> tuple[Any, ...]:
    from dataclasses import fields

    from seqtrans.serving.settings import ServeSettings

    return fields(ServeSettings)


SUBCOMMANDS = (
    Command("tasks", "List installed tasks with their distribution, version and load status.",
            "List the tasks registered under the 'seqtrans.tasks' entry-point group."),
    Command("new-task", "Write a new task plugin package to start from.",
            "Write DIR (default: ./seqtrans-NAME): pyproject.toml registering the task under the "
            "'seqtrans.tasks' entry point, the task module (a toy that reverses the letters of short "
            "words, with built-in data, scored by the character error rate), its tests, a README "
            "and py.typed. As written it passes its own pytest and mypy, and after 'pip install -e "
            "DIR' 'seqtrans run NAME' trains it in seconds. See docs/plugins.md.",
            (arg("name", metavar="NAME", help="The task's name: a lower-case Python identifier that no "
                                              "installed task has."),
             arg("--dir", type=Path, help="Where to write the package (must not exist, or be empty)."))),
    Command("run", "Train a task end to end and score its test split.",
            "Prepare data, build the vocabulary, train, average the last checkpoints, decode "
            "the test split with the task's decoding settings and score it. Writes "
            "DIR/metrics.json, DIR/predictions/test.txt, DIR/config.json and DIR/checkpoints/. "
            "An existing DIR is continued from its newest checkpoint.",
            (*CONFIG_ARGS,
             arg("--out", metavar="DIR", type=Path,
                 help="Run directory (default: runs/TASK-YYYYMMDD-HHMMSS)."),
             arg("--init", metavar="RUN_DIR", type=Path,
                 help="Start from the model of this run directory or checkpoint (one trained, or "
                      "imported with 'seqtrans import'): its model options, vocabulary and weights; "
                      "--set may still change model dropout. Fine-tuning: see docs/pretrained.md."),
             arg("--vocab", metavar="RUN_DIR", type=Path,
                 help="Take the vocabulary files of this run directory or checkpoint (a model of the "
                      "same task) instead of building them, and train new weights: a distilled student "
                      "with its teacher's vocabulary ('seqtrans distill'). A run directory being "
                      "continued must have the same files."),
             arg("--nproc", type=int, default=1, metavar="N",
                 help="Train data-parallel with N processes on this machine (one per GPU, or N "
                      "CPU processes with gloo): a shortcut for 'torchrun --standalone "
                      "--nproc_per_node N -m seqtrans run ...'. Under torchrun it is ignored."),
             DEVICE)),
    Command("prepare", "Prepare a task's training data once: vocabulary and memory-mapped ids.",
            "Read the training split as a stream, build the vocabulary, encode the pairs with "
            "worker processes (train.prepare_workers) and write a memory-mapped dataset under "
            "train.data_cache, keyed by the data and the settings that shape it. 'seqtrans run' "
            "with the same data and settings uses it without preparing again (and prepares it "
            "itself when it is missing). Found in the cache, its files are checked against "
            "their sha256; an interrupted preparation resumes. Prints a summary as JSON.",
            CONFIG_ARGS),
    Command("config", "Print the resolved configuration with each key's help.",
            "Resolve a run's configuration as 'seqtrans run' would and print "
            "every key, its value and its help (or JSON with --json).",
            (*CONFIG_ARGS,
             arg("--json", action="store_true", help="Print the config as JSON instead."),
             arg("--markdown", action="store_true", help="Print a Markdown table instead."))),
    Command("predict", "Decode lines from stdin with a trained model.",
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
                      "token was written). Greedy; needs model.causal_encoder=true and a model that "
                      "decides when to read: model.cross_attention=monotonic, milk, mma_hard or "
                      "mma_il, or wait-k "
                      "(model.wait_k, or decode.wait_k for any scaled_dot model; without a lag it "
                      "reads the whole input first)."),
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
             DECODE_SET, DEVICE)),
    Command("evaluate", "Decode and score a split with a trained model.",
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
                      "stream: model.causal_encoder=true and a cross-attention that decides when to "
                      "read (monotonic, milk, or scaled_dot with a wait-k lag)."),
             arg("--output", metavar="FILE", type=Path,
                 help="With --stream: write the metrics here instead."),
             arg("--instances", metavar="FILE", type=Path,
                 help="With --stream: write each sentence's output and delays to FILE, one JSON line "
                      "each, in the form of SimulEval's instances.log."),
             *(arg(flag, type=kind, metavar=key.upper(), help=f"decode.{key}: {_decode_help(key)}")
               for flag, key, kind in SAMPLING_FLAGS),
             DECODE_SET, DEVICE)),
    Command("score", "Print the log-probability of given source-target pairs.",
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
             DECODE_SET, DEVICE)),
    Command("serve", "Serve trained models over HTTP and WebSocket (the serve extra).",
            "Load the runs and answer requests until SIGINT or SIGTERM: GET /v1/models, POST "
            "/v1/models/NAME/predict (concurrent requests decoded together in batches), a "
            "WebSocket for simultaneous translation with models that can stream, /health, /ready, "
            "/metrics (Prometheus) and a page at /. A model is named by its run directory's name, "
            "or NAME=RUN_DIR; NAME=RUN_A,RUN_B serves an ensemble. With SEQTRANS_SERVE_TOKEN set, "
            "requests need 'Authorization: Bearer TOKEN'. On SIGTERM it stops accepting, answers "
            "what is in flight and exits 0. Needs pip install 'seqtrans[serve]'; see docs/serving.md.",
            (arg("models", nargs="+", metavar="RUN_DIR",
                 help="Runs to serve: RUN_DIR, NAME=RUN_DIR, or NAME=RUN_A,RUN_B (an ensemble)."),
             *(arg("--" + f.name.replace("_", "-"), type=_workers if f.name == "workers" else type(f.default),
                   default=f.default, metavar=f.name.upper(), help=f.metadata["help"])
               for f in _serve_fields()),
             DEVICE)),
    Command("plot", "Draw the learning curves of runs as a PNG.",
            "Read the runs' logs (DIR/train.jsonl) and draw training loss, dev "
            "loss, the task's dev metrics, learning rate and tokens/s, against "
            "updates and against training minutes, every run in each panel. "
            "Needs matplotlib (pip install 'seqtrans[plot]').",
            (arg("runs", nargs="+", metavar="RUN_DIR", type=Path),
             arg("--out", metavar="FILE", type=Path,
                 help="The PNG to write (default: RUN_DIR/curves.png of the first run)."))),
    Command("import", "Read a model of another toolkit as a run directory.",
            "Convert the model in directory DIR, in the format FORMAT that an installed plugin "
            "registers (seqtrans.formats entry points; the translation plugin: hf-marian, a Hugging "
            "Face Marian model such as OPUS-MT), into a new run directory that predict, evaluate, "
            "score, serve, export and 'run --init' accept, written whole or not at all. See "
            "docs/pretrained.md.",
            (arg("format", metavar="FORMAT", help="The format of DIR."),
             arg("source", metavar="DIR", type=Path, help="The model directory to read."),
             arg("--out", metavar="RUN_DIR", type=Path, required=True,
                 help="The run directory to create (must not exist)."))),
    Command("export", "Write a trained model in another engine's format (CTranslate2, or a plugin's).",
            "Export the model of a run directory or checkpoint to a new directory OUT, "
            "written whole or not at all. Any other FORMAT is one an installed plugin registers "
            "(the translation plugin: hf-marian, see docs/pretrained.md). 'ctranslate2': a "
            "CTranslate2 Transformer model "
            "(model.bin, config.json and the vocabularies), for models with scaled_dot "
            "attention at every site, a bidirectional encoder and no model extension of its task. "
            "Decode it with ctranslate2.Translator on token strings, the source without its end "
            "symbol (CTranslate2 appends it). Needs ctranslate2 (pip install "
            "'seqtrans[export]'); see docs/export.md.",
            (MODEL,
             arg("--to", required=True, metavar="FORMAT",
                 help=f"The format to write: {', '.join(EXPORT_FORMATS)} or one a plugin registers."),
             arg("out", metavar="OUT", type=Path, help="The directory to create (must not exist)."),
             arg("--quantization", choices=list(EXPORT_QUANTIZATIONS),
                 help="Store the weights in this type (default: float32). int8 quantizes every "
                      "weight matrix and embedding per row; CTranslate2 can still compute in "
                      "another type (its compute_type)."))),
    Command("attention", "Draw a trained model's attention on one input as PNGs.",
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
             BEAM, DEVICE)),
    Command("shortlist", "Build a run's vocabulary shortlist from its training data (decode.shortlist).",
            "Count which target tokens go with each source token in the run's training pairs (IBM "
            "Model 1's translation table, by expectation-maximisation), keep the best of each and "
            "the most frequent target tokens, and write RUN_DIR/shortlist.npz with the digest of "
            "the run's vocabulary files (a shortlist of another vocabulary is refused when it "
            "loads). Decoding with decode.shortlist=true then computes the output projection only "
            "over the tokens a batch's sources may produce. 'export --to ctranslate2' carries it as "
            "CTranslate2's vocabulary map. See docs/speed.md.",
            (MODEL,
             *(arg("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                   metavar="N", help=f.metadata["help"]) for f in _shortlist_fields()))),
    Command("distill", "Translate a run's training sources with it into a corpus for a student.",
            "Sequence-level knowledge distillation (Kim and Rush 2016): decode the training split of "
            "TEACHER's task with TEACHER (its decoding settings: beam search, batched; --set "
            "decode.precision=int8 is faster) and write OUT/train.src and OUT/train.tgt, one pair a "
            "line, as the task reads them back, and OUT/distill.json. OUT appears whole or not at "
            "all; an interrupted distillation (kill -9 too) resumes from OUT.partial with the same "
            "outputs. Prints the command that trains a student on the corpus with TEACHER's "
            "vocabulary (run --vocab TEACHER --set data...). Needs a task that reads training pairs "
            "from files (TrainingFiles; translation does). See the translation task's page.",
            (arg("teacher", metavar="TEACHER", help="The teacher: a run directory or checkpoint."),
             arg("--out", required=True, metavar="DIR", type=Path,
                 help="The corpus directory to create (an existing one made with the same "
                      "settings is kept)."),
             arg("--mix", action="store_true",
                 help="Also keep every original pair: each source twice, with the teacher's output "
                      "and with its reference."),
             arg("--chunk", type=int, default=2000, metavar="N",
                 help="Sentences decoded and written at a time (what a resumption starts again from)."),
             arg("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                 help="Override the teacher's decode.* (or data.*) keys, e.g. decode.precision=int8."),
             DEVICE)),
    Command("average", "Average checkpoints into one model.",
            "Write the element-wise mean of the checkpoints' parameters.",
            (arg("checkpoints", nargs="+", metavar="CKPT", type=Path),
             arg("--out", required=True, metavar="FILE", type=Path))),
    Command("upgrade", "Convert a run saved by an earlier version of its task's plugin.",
            "Rewrite config.json and every checkpoint of RUN_DIR in the form its task's plugin "
            "saves today (each file replaced whole; safe to run again). Decoding converts an "
            "earlier run as it loads it; continuing its training needs this first. Prints what "
            "changed.",
            (arg("run_dir", metavar="RUN_DIR", type=Path),)),
)


def _plugin_commands() -> dict[str, list[TaskEntry]]:
    return {name: entries for name, entries in installed(group=COMMAND_GROUP).items()
            if name not in COMMANDS}


def _add(parser: argparse.ArgumentParser, args: Sequence[Arg]) -> None:
    for a in args:
        # a list default of its own per parser: argparse hands the default itself to the namespace
        settings: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in a.settings.items()}
        parser.add_argument(*a.names, **settings)


def build_parser() -> argparse.ArgumentParser:
    plugin_commands = _plugin_commands()
    epilog = None
    if plugin_commands:
        epilog = "commands from plugins: " + ", ".join(
            f"{name} ({entries[0].distribution})" for name, entries in sorted(plugin_commands.items())
        ) + " (run 'seqtrans NAME --help')"
    parser = argparse.ArgumentParser(
        prog="seqtrans", epilog=epilog,
        description="Sequence transduction with the Transformer: train, decode and score task plugins.",
    )
    parser.add_argument("--version", action="version", version=f"seqtrans {__version__}")
    _add(parser, GLOBAL_ARGS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        _add(sub.add_parser(command.name, help=command.help, description=command.description), command.args)
    return parser


def _cmd_tasks(args: argparse.Namespace) -> int:
    from seqtrans import tasks
    from seqtrans.tasks.discovery import load_entry

    found = tasks.installed()
    if not found:
        print("no tasks installed (pip install a plugin such as plugins/copy)")
        return 0
    rows = [("TASK", "DISTRIBUTION", "VERSION", "STATUS")]
    for name in sorted(found):
        for entry in found[name]:
            if len(found[name]) > 1:
                status = "error: name offered by several distributions"
            else:
                try:
                    load_entry(entry)
                    status = "ok"
                except SeqtransError as exc:
                    status = f"error: {exc}"
            rows.append((name, entry.distribution, entry.version, status))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    return 0


def _cmd_new_task(args: argparse.Namespace) -> int:
    from seqtrans.tasks.scaffold import new_task

    for path in new_task(args.name, directory=args.dir):
        print(f"wrote {path}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from seqtrans import tasks
    from seqtrans.prepare import prepare

    config = tasks.resolve_config(args.task, preset=args.preset, config_file=args.config_file,
                            overrides=args.overrides)
    task = tasks.load(config.task)(config.data)
    prepared = prepare(task, config, progress=_progress(args), verify=True)
    meta = prepared.dataset.meta
    summary = {"directory": str(prepared.directory), "reused": prepared.reused,
               **{k: meta[k] for k in ("pairs", "inputs_read", "tokens", "removed", "vocabulary")}}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from seqtrans.config import describe, markdown_table, to_dict
    from seqtrans.tasks import resolve_config

    config = resolve_config(args.task, preset=args.preset, config_file=args.config_file,
                            overrides=args.overrides)
    if args.json:
        print(json.dumps(to_dict(config), indent=2))
        return 0
    if args.markdown:
        print(markdown_table(config), end="")
        return 0
    for key, type_name, value, help_text in describe(config):
        print(f"{key} = {json.dumps(to_dict(value))}  ({type_name})")
        if help_text:
            print(f"    {help_text}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from seqtrans.pipeline import default_directory, resolve_config, run
    from seqtrans.training.world import world_from_env

    config = resolve_config(args.task, preset=args.preset, config_file=args.config_file,
                            overrides=args.overrides)
    init = None
    if args.init is not None:
        from seqtrans.pipeline import initial, with_initial_model

        init = initial(args.init)
        config = with_initial_model(config, init, args.overrides)
    vocabulary = None
    if args.vocab is not None:
        if init is not None:
            raise UsageError("--init brings its model's vocabulary; give --init or --vocab, not both")
        from seqtrans.pipeline import vocabulary_of

        vocabulary = vocabulary_of(args.vocab, config)
    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    out = args.out or default_directory(args.task)
    world = world_from_env()
    if args.nproc > 1 and not world.distributed:
        from seqtrans.training.distributed import launch

        # this command line again in each rank, with the run directory named here for all
        return launch(args.nproc, [*args.argv, *([] if args.out else ["--out", str(out)])])
    metrics = run(config, out, device=args.device, progress=_progress(args), init=init, vocabulary=vocabulary)
    if world.main:
        print(json.dumps(metrics, indent=2, sort_keys=True))
        print(f"run directory: {out}", file=sys.stderr)
    return 0


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


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from seqtrans.inference.loading import evaluate

    overrides = _decode_overrides(args)
    for flag, value in (("--output", args.output), ("--instances", args.instances)):
        if value is not None and not args.stream:
            raise UsageError(f"{flag} is for --stream (evaluate otherwise prints its metrics only)")
    metrics = evaluate(args.models, split=args.split, overrides=overrides, device=args.device,
                       progress=_progress(args), stream=args.stream, instances=args.instances)
    if args.stream:
        from seqtrans.streaming.evaluation import metrics_path

        path = args.output or metrics_path(args.models[0], split=args.split, overrides=args.overrides)
        atomic.write_json(path, metrics)
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from seqtrans.inference.export import export

    path = export(args.model, to=args.to, out=args.out, quantization=args.quantization)
    print(f"wrote {path}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from seqtrans.inference import formats

    path = formats.load(args.format).import_model(args.source, out=args.out)
    print(f"wrote {path}")
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from seqtrans.inference.loading import load_ensemble
    from seqtrans.inference.scoring import format_score, score_files

    loaded = load_ensemble(args.models, overrides=args.overrides, device=args.device)
    scores = score_files(loaded, args.src, args.tgt, progress=_progress(args))
    alpha = loaded.config.decode.alpha if args.normalize else None
    kind = loaded.config.decode.length_penalty
    text = "".join(format_score(s, alpha=alpha, kind=kind) + "\n" for s in scores)
    if args.out is None:
        sys.stdout.write(text)
    else:
        atomic.write_text(args.out, text)  # a failed run leaves no half-written scores
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from seqtrans.serving.server import check_installed, serve
    from seqtrans.serving.settings import ServeSettings

    check_installed()  # before loading models, which takes a while
    settings = ServeSettings(**{f.name: getattr(args, f.name) for f in _serve_fields()})
    serve(args.models, settings, device=args.device, token=environment.serve_token(), threads=args.threads)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from seqtrans.training.plot import plot

    path = plot(args.runs, args.out or args.runs[0] / "curves.png")
    print(f"wrote {path}")
    return 0


def _cmd_attention(args: argparse.Namespace) -> int:
    from seqtrans.inference.heatmaps import attend, draw
    from seqtrans.inference.loading import load

    overrides = [f"decode.beam={args.beam}"] if args.beam is not None else []
    loaded = load(args.model, overrides=overrides, device=args.device)
    run_dir = Path(args.model) if Path(args.model).is_dir() else Path(args.model).parent
    out = args.out or run_dir / "attention"
    for path in draw(attend(loaded, args.input, target=args.target), out, layers=args.layers):
        print(f"wrote {path}")
    return 0


def _cmd_shortlist(args: argparse.Namespace) -> int:
    from seqtrans.shortlist.build import build_shortlist
    from seqtrans.shortlist.table import ShortlistSettings

    settings = ShortlistSettings(**{f.name: getattr(args, f.name) for f in _shortlist_fields()})
    print(f"wrote {build_shortlist(args.model, settings=settings, progress=_progress(args))}")
    return 0


def _cmd_distill(args: argparse.Namespace) -> int:
    from seqtrans.inference.distill import distill

    corpus = distill(args.teacher, args.out, overrides=args.overrides, mix=args.mix, chunk=args.chunk,
                     device=args.device, progress=_progress(args))
    print(f"wrote {corpus.directory} ({corpus.pairs} pairs); train a student on it with:")
    print(f"  {corpus.command(args.teacher)} [--preset ...]")
    return 0


def _cmd_average(args: argparse.Namespace) -> int:
    from seqtrans.pipeline import average

    path = average(args.checkpoints, args.out)
    print(f"averaged {len(args.checkpoints)} checkpoints into {path}")
    return 0


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from seqtrans.training.upgrade import upgrade_run

    changes = upgrade_run(args.run_dir)
    for line in changes:
        print(line)
    print(f"{args.run_dir}: {'converted' if changes else 'already current; nothing changed'}")
    return 0


def _progress(args: argparse.Namespace) -> bool:
    if args.progress != "auto":
        return bool(args.progress == "on")
    return not args.quiet and sys.stderr.isatty()


COMMANDS = {"tasks": _cmd_tasks, "config": _cmd_config, "prepare": _cmd_prepare, "run": _cmd_run,
            "predict": _cmd_predict, "evaluate": _cmd_evaluate, "score": _cmd_score, "average": _cmd_average,
            "plot": _cmd_plot, "import": _cmd_import, "export": _cmd_export, "attention": _cmd_attention,
            "upgrade": _cmd_upgrade, "serve": _cmd_serve, "shortlist": _cmd_shortlist,
            "distill": _cmd_distill, "new-task": _cmd_new_task}


def _run_plugin_command(argv: list[str]) -> int | None:
    """Run ``seqtrans NAME ARGS`` when NAME is a plugin's command; None when it is not."""
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if first is None or argv[first] in COMMANDS:
        return None
    name = argv[first]
    entries = installed(group=COMMAND_GROUP).get(name)
    if not entries:
        return None
    try:
        if len(entries) > 1:
            offered = ", ".join(f"{e.distribution} {e.version}" for e in entries)
            raise UsageError(f"command name '{name}' is offered by several distributions: {offered}")
        command = load_object(entries[0], kind="command")
        if not callable(command):
            raise UsageError(f"command {entries[0].label} is not callable")
        return int(command(argv[first + 1 :]) or 0)
    except SeqtransError as exc:
        return _failed(f"seqtrans {name}", exc)


def _failed(where: str, exc: SeqtransError) -> int:
    """Print the error on one line; the exit status: 2 for a usage error, 1 for another."""
    print(f"{where}: error: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, UsageError) else 1


def main(argv: Sequence[str] | None = None) -> int:
    from seqtrans.training.world import SINGLE, world_from_env

    argv = list(sys.argv[1:] if argv is None else argv)
    code = _run_plugin_command(argv)
    if code is not None:
        return code
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        set_wait_policy(args.wait_policy)  # before anything loads torch, whose OpenMP reads it once
        set_threads(args.threads)
        if environment.malloc() == "keep":
            keep_freed_memory()
    except UsageError as exc:
        return _failed("seqtrans", exc)
    except ValueError as exc:  # the environment's
        return _failed("seqtrans", UsageError(str(exc)))
    try:
        world = world_from_env()
    except UsageError:
        world = SINGLE  # reported when the command joins the group
    # ranks other than 0 log warnings only, each line naming its rank
    where = f"seqtrans {args.command}" + (f" (rank {world.rank})" if world.distributed else "")
    logging.basicConfig(level=logging.WARNING if args.quiet or world.rank else logging.INFO,
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s "
                        + (f"[rank {world.rank}] " if world.distributed else "") + "%(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except Interrupted as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except SeqtransError as exc:
        return _failed(where, exc)
    except KeyboardInterrupt:
        print("seqtrans: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
