"""The ``seqtrans`` command line: :func:`main`, which runs a command and turns its errors
into exit statuses. It only translates: the commands' specs and handlers are in one
module per group (:mod:`~seqtrans.cli.train`, :mod:`~seqtrans.cli.decode`,
:mod:`~seqtrans.cli.models`, :mod:`~seqtrans.cli.serve`, :mod:`~seqtrans.cli.tasks`),
the parser in :mod:`~seqtrans.cli.parser`, and the work in :mod:`seqtrans.pipeline` and
the inference modules, which the Python API calls alike.

Exit status: 0 on success, 2 on usage or configuration errors, 1 on data or
checkpoint errors (a one-line message naming the file and line).

Plugins may add commands through the ``seqtrans.commands`` entry-point group: the
entry point names a callable ``main(argv: list[str]) -> int`` that parses its own
arguments; ``seqtrans NAME ARGS...`` calls it with ``ARGS`` (docs/plugins.md).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from seqtrans.cli.parser import COMMANDS, build_parser
from seqtrans.errors import Interrupted, SeqtransError, UsageError
from seqtrans.runtime import environment
from seqtrans.runtime.system import keep_freed_memory
from seqtrans.runtime.threads import set_threads, set_wait_policy
from seqtrans.tasks.discovery import COMMAND_GROUP, installed, load_object

__all__ = ["COMMANDS", "build_parser", "main"]


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
