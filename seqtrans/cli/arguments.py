"""How a command is written down (:class:`Command`, its arguments made with :func:`arg`),
the arguments several commands share, and how ``--progress`` and ``-q`` decide on bars.

Each command module holds its commands' specs, each beside its handler;
:mod:`seqtrans.cli.parser` puts them in one parser. Nothing here imports torch: ``--help``
and the commands that need no model start without it."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODELS_HELP = ("A run directory or checkpoint; several (of one vocabulary) decode as an ensemble that "
               "averages their log-probabilities at each step, with the first one's task and decoding "
               "settings; the checkpoints it averages are named on stderr.")
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


def finite_float(text: str) -> float:
    """A float flag's value: NaN passes every range check and infinity every limit, so
    both are refused (argparse's usage error names the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, its description, its arguments, in order, and
    the handler that runs it on the parsed arguments and returns the exit status."""

    name: str
    help: str
    description: str
    args: tuple[Arg, ...] = ()
    handler: Callable[[argparse.Namespace], int] = field(kw_only=True)


def add_arguments(parser: argparse.ArgumentParser, args: Sequence[Arg]) -> None:
    for a in args:
        # a list default of its own per parser: argparse hands the default itself to the namespace
        settings: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in a.settings.items()}
        parser.add_argument(*a.names, **settings)


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


def progress(args: argparse.Namespace) -> bool:
    """Whether to show progress bars: as ``--progress`` says, or with ``auto`` when
    standard error is a terminal and ``-q`` is not given."""
    if args.progress != "auto":
        return bool(args.progress == "on")
    return not args.quiet and sys.stderr.isatty()
