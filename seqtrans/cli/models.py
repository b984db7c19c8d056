"""Commands that convert models: ``import`` (another toolkit's model as a run),
``export`` (a run in another engine's format) and ``upgrade`` (a run of an earlier
version). Each spec sits beside its handler."""

from __future__ import annotations

import argparse
from pathlib import Path

from seqtrans.cli.arguments import MODEL, Command, arg
from seqtrans.inference.export import FORMATS as EXPORT_FORMATS
from seqtrans.inference.export import QUANTIZATIONS as EXPORT_QUANTIZATIONS


def _cmd_import(args: argparse.Namespace) -> int:
    from seqtrans.inference import formats

    path = formats.load(args.format).import_model(args.source, out=args.out, allow_pickle=args.allow_pickle)
    print(f"wrote {path}")
    return 0


IMPORT = Command(
    "import", "Read a model of another toolkit as a run directory.",
    "Convert the model in directory DIR, in the format FORMAT that an installed plugin "
    "registers (seqtrans.formats entry points; the translation plugin: hf, a Hugging Face "
    "model directory of the families its config.json names (NLLB, M2M-100, mBART-50, BART, "
    "T5, Flan-T5, mT5, ByT5, Marian), and hf-marian), into a new run directory that predict, "
    "evaluate, score, serve, export and 'run --init' accept, written whole or not at all. See "
    "docs/pretrained.md.",
    (arg("format", metavar="FORMAT", help="The format of DIR."),
     arg("source", metavar="DIR", type=Path, help="The model directory to read."),
     arg("--out", metavar="RUN_DIR", type=Path, required=True,
         help="The run directory to create (must not exist)."),
     arg("--allow-pickle", action="store_true",
         help="Read weights from a pickled pytorch_model.bin where the directory has no "
              "safetensors file. Loading a pickle can run any code it holds: only for a "
              "directory you trust.")),
    handler=_cmd_import,
)


def _cmd_export(args: argparse.Namespace) -> int:
    from seqtrans.inference.export import export

    path = export(args.model, to=args.to, out=args.out, quantization=args.quantization)
    print(f"wrote {path}")
    return 0


EXPORT = Command(
    "export", "Write a trained model in another engine's format (CTranslate2, or a plugin's).",
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
              "another type (its compute_type).")),
    handler=_cmd_export,
)


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from seqtrans.training.upgrade import upgrade_run

    changes = upgrade_run(args.run_dir)
    for line in changes:
        print(line)
    print(f"{args.run_dir}: {'converted' if changes else 'already current; nothing changed'}")
    return 0


UPGRADE = Command(
    "upgrade", "Convert a run saved by an earlier version of its task's plugin.",
    "Rewrite config.json and every checkpoint of RUN_DIR in the form its task's plugin "
    "saves today (each file replaced whole; safe to run again). Decoding converts an "
    "earlier run as it loads it; continuing its training needs this first. Prints what "
    "changed.",
    (arg("run_dir", metavar="RUN_DIR", type=Path),),
    handler=_cmd_upgrade,
)
