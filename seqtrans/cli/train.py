"""Commands that train: ``run``, ``prepare``, ``config``, ``average``, ``distill`` and
``plot`` (a run's learning curves). Each spec sits beside its handler; the work is
:mod:`seqtrans.pipeline`'s and the inference modules', which the Python API calls too."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from seqtrans.cli.arguments import CONFIG_ARGS, DEVICE, Command, arg, progress
from seqtrans.errors import UsageError


def _cmd_run(args: argparse.Namespace) -> int:
    from seqtrans.pipeline import default_directory, run
    from seqtrans.tasks.configuration import resolve_config
    from seqtrans.training.world import world_from_env

    config = resolve_config(args.task, preset=args.preset, config_file=args.config_file,
                            overrides=args.overrides)
    init = vocabulary = None
    if args.init is not None:
        from seqtrans.training.initial import initial, with_initial_model

        init = initial(args.init)
        config = with_initial_model(config, init, args.overrides)
    if args.vocab is not None:
        from seqtrans.training.initial import vocabulary_of

        vocabulary = vocabulary_of(args.vocab, config)
    if args.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {args.nproc}")
    out = args.out or default_directory(args.task)
    world = world_from_env()
    if args.nproc > 1 and not world.distributed:
        from seqtrans.training.distributed import launch

        # this command line again in each rank, with the run directory named here for all
        return launch(args.nproc, [*args.argv, *([] if args.out else ["--out", str(out)])])
    metrics = run(config, out, device=args.device, progress=progress(args), init=init, vocabulary=vocabulary)
    if world.main:
        print(json.dumps(metrics, indent=2, sort_keys=True))
        print(f"run directory: {out}", file=sys.stderr)
    return 0


RUN = Command(
    "run", "Train a task end to end and score its test split.",
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
              "--set may still change model dropout. A model of another task keeps its "
              "vocabulary where both tasks read and write text (a pretrained text-to-text "
              "model). Fine-tuning: see docs/pretrained.md."),
     arg("--vocab", metavar="RUN_DIR", type=Path,
         help="Take the vocabulary files of this run directory or checkpoint (a model of the "
              "same task) instead of building them, and train new weights: a distilled student "
              "with its teacher's vocabulary ('seqtrans distill'). A run directory being "
              "continued must have the same files."),
     arg("--nproc", type=int, default=1, metavar="N",
         help="Train data-parallel with N processes on this machine (one per GPU, or N "
              "CPU processes with gloo): a shortcut for 'torchrun --standalone "
              "--nproc_per_node N -m seqtrans run ...'. Under torchrun it is ignored."),
     DEVICE),
    handler=_cmd_run,
)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from seqtrans import tasks
    from seqtrans.prepare import prepare
    from seqtrans.tasks.configuration import resolve_config

    config = resolve_config(args.task, preset=args.preset, config_file=args.config_file,
                            overrides=args.overrides)
    task = tasks.load(config.task)(config.data)
    prepared = prepare(task, config, progress=progress(args), verify=True)
    meta = prepared.dataset.meta
    summary = {"directory": str(prepared.directory), "reused": prepared.reused,
               **{k: meta[k] for k in ("pairs", "inputs_read", "tokens", "removed", "vocabulary")}}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


PREPARE = Command(
    "prepare", "Prepare a task's training data once: vocabulary and memory-mapped ids.",
    "Read the training split as a stream, build the vocabulary, encode the pairs with "
    "worker processes (train.prepare_workers) and write a memory-mapped dataset under "
    "prepared/ of the cache (data.cache_dir where the task has it, else $SEQTRANS_CACHE_DIR "
    "or ~/.cache/seqtrans), keyed by the data and the settings that shape it. 'seqtrans run' "
    "with the same data and settings uses it without preparing again (and prepares it "
    "itself when it is missing). Found in the cache, its files are checked against "
    "their sha256; an interrupted preparation resumes. Prints a summary as JSON.",
    CONFIG_ARGS,
    handler=_cmd_prepare,
)


def _cmd_config(args: argparse.Namespace) -> int:
    from seqtrans.config import describe, markdown_table, to_dict
    from seqtrans.tasks.configuration import resolve_config

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


CONFIG = Command(
    "config", "Print the resolved configuration with each key's help.",
    "Resolve a run's configuration as 'seqtrans run' would and print "
    "every key, its value and its help (or JSON with --json).",
    (*CONFIG_ARGS,
     arg("--json", action="store_true", help="Print the config as JSON instead."),
     arg("--markdown", action="store_true", help="Print a Markdown table instead.")),
    handler=_cmd_config,
)


def _cmd_average(args: argparse.Namespace) -> int:
    from seqtrans.pipeline import average

    path = average(args.checkpoints, args.out)
    print(f"averaged {len(args.checkpoints)} checkpoints into {path}")
    return 0


AVERAGE = Command(
    "average", "Average checkpoints into one model.",
    "Write the element-wise mean of the checkpoints' parameters.",
    (arg("checkpoints", nargs="+", metavar="CKPT", type=Path),
     arg("--out", required=True, metavar="FILE", type=Path)),
    handler=_cmd_average,
)


def _cmd_distill(args: argparse.Namespace) -> int:
    from seqtrans.inference.distill import distill

    corpus = distill(args.teacher, args.out, overrides=args.overrides, mix=args.mix, chunk=args.chunk,
                     device=args.device, progress=progress(args))
    print(f"wrote {corpus.directory} ({corpus.pairs} pairs); train a student on it with:")
    print(f"  {corpus.command(args.teacher)} [--preset ...]")
    return 0


DISTILL = Command(
    "distill", "Translate a run's training sources with it into a corpus for a student.",
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
     DEVICE),
    handler=_cmd_distill,
)


def _cmd_plot(args: argparse.Namespace) -> int:
    from seqtrans.training.plot import plot

    path = plot(args.runs, args.out or args.runs[0] / "curves.png")
    print(f"wrote {path}")
    return 0


PLOT = Command(
    "plot", "Draw the learning curves of runs as a PNG.",
    "Read the runs' logs (DIR/train.jsonl) and draw training loss, dev "
    "loss, the task's dev metrics, learning rate and tokens/s, against "
    "updates and against training minutes, every run in each panel. "
    "A run that logged too little to draw a curve (no quantity at two updates) "
    "gets a warning; when every run did, nothing is written and the exit status is 1. "
    "Needs matplotlib (pip install 'seqtrans[plot]').",
    (arg("runs", nargs="+", metavar="RUN_DIR", type=Path),
     arg("--out", metavar="FILE", type=Path,
         help="The PNG to write (default: RUN_DIR/curves.png of the first run).")),
    handler=_cmd_plot,
)
