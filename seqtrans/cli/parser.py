"""The ``seqtrans`` argument parser: the global options, and every command of the
command modules in the order ``seqtrans --help`` lists them, with the commands that
plugins add named in its epilog."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from seqtrans import __version__
from seqtrans.cli import decode, models, serve, tasks, train
from seqtrans.cli.arguments import Command, add_arguments, arg
from seqtrans.errors import UsageError
from seqtrans.runtime.threads import parse_threads, parse_wait_policy
from seqtrans.tasks.discovery import COMMAND_GROUP, TaskEntry, installed


def _threads(text: str) -> int:
    try:
        return parse_threads(text, name="--threads")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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

#: The engine's commands, in the order of ``seqtrans --help``.
SUBCOMMANDS: tuple[Command, ...] = (
    tasks.TASKS, tasks.NEW_TASK, train.RUN, train.PREPARE, train.CONFIG, decode.PREDICT, decode.EVALUATE,
    decode.SCORE, serve.SERVE, train.PLOT, models.IMPORT, models.EXPORT, decode.ATTENTION, decode.SHORTLIST,
    train.DISTILL, train.AVERAGE, models.UPGRADE,
)

#: Each engine command's handler, by name.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {c.name: c.handler for c in SUBCOMMANDS}


def plugin_commands() -> dict[str, list[TaskEntry]]:
    """The commands of the ``seqtrans.commands`` entry-point group that no engine command
    shadows, with the distributions that offer each (unloaded)."""
    return {name: entries for name, entries in installed(group=COMMAND_GROUP).items()
            if name not in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    commands = plugin_commands()
    epilog = None
    if commands:
        epilog = "commands from plugins: " + ", ".join(
            f"{name} ({entries[0].distribution})" for name, entries in sorted(commands.items())
        ) + " (run 'seqtrans NAME --help')"
    parser = argparse.ArgumentParser(
        prog="seqtrans", epilog=epilog,
        description="Sequence transduction with the Transformer: train, decode and score task plugins.",
    )
    parser.add_argument("--version", action="version", version=f"seqtrans {__version__}")
    add_arguments(parser, GLOBAL_ARGS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        add_arguments(sub.add_parser(command.name, help=command.help, description=command.description),
                      command.args)
    return parser
