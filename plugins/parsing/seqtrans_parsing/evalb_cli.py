"""``seqtrans evalb GOLD TEST [-p PRM]``: the EVALB report, as the reference program prints it.

Registered under the ``seqtrans.commands`` entry-point group. Options are applied in
the order given, as the reference program does (``-p FILE -e 5`` lets ``-e`` win).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqtrans_parsing.evalb import COLLINS, Parameters, evalb, parse_parameters

_DESCRIPTION = """Score the trees of TEST against those of GOLD (one tree per line) with
EVALB's algorithm (Sekine and Collins 1997, with the 2006 revision) and print its
report: stdout and stderr are, byte for byte, those of the reference program.
Without -p, EVALB's built-in defaults apply (labelled, nothing deleted); the standard
setting for Penn Treebank results is COLLINS.prm."""


class _InOrder(argparse.Action):
    """Records options in the order given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        steps = list(getattr(namespace, "steps", None) or [])
        steps.append((self.dest, self.const if self.nargs == 0 else values))
        namespace.steps = steps


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seqtrans evalb", description=_DESCRIPTION)
    p.add_argument("gold", type=Path, metavar="GOLD", help="Gold trees, one per line.")
    p.add_argument("test", type=Path, metavar="TEST",
                   help="Test (parser output) trees, one per line, in the same order.")
    p.add_argument("-p", dest="prm", action=_InOrder, metavar="PRM", help="Parameter file, e.g. COLLINS.prm.")
    p.add_argument("--collins", dest="collins", action=_InOrder, nargs=0, const=True,
                   help="The parameters of COLLINS.prm, built in (the task's metric).")
    p.add_argument("-e", dest="max_error", action=_InOrder, type=int, metavar="N",
                   help="Stop after more than N+1 errors (default 10, or MAX_ERROR of the parameter file).")
    p.add_argument("-c", dest="cutoff", action=_InOrder, type=int, metavar="N",
                   help="Cut-off length of the second summary (default 40, or CUTOFF_LEN).")
    p.add_argument("-d", dest="debug", action=_InOrder, nargs=0, const=1,
                   help="Debug output: the data of each sentence.")
    p.add_argument("-D", dest="debug", action=_InOrder, nargs=0, const=2,
                   help="Debug output with bracketing details.")
    p.add_argument("--no-limits", action="store_true",
                   help="Score sentences past the reference program's buffers (4,998 bytes per line, "
                        "200 words, 200 brackets) instead of reporting them as errors.")
    p.set_defaults(steps=[])
    return p


def _read(path: Path, what: str) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError:
        sys.stderr.write(f"Can't open {what} file ({path})\n")
        return None


def _write(stream: Any, text: str) -> None:
    stream.flush()
    stream.buffer.write(text.encode("utf-8", "surrogateescape"))
    stream.buffer.flush()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    params = Parameters()
    for dest, value in args.steps:
        if dest == "prm":
            text = _read(Path(value), "parameter")
            if text is None:
                return 1
            params, warnings = parse_parameters(text, base=params)
            if warnings:
                _write(sys.stderr, "".join(warnings))
        elif dest == "collins":
            params = COLLINS
        elif dest == "max_error":
            params = replace(params, max_error=value)
        elif dest == "cutoff":
            params = replace(params, cutoff_len=value)
        elif dest == "debug":
            params = replace(params, debug=value)
    gold = _read(args.gold, "gold")
    if gold is None:
        return 1
    test = _read(args.test, "test")
    if test is None:
        return 1
    report = evalb(gold, test, params, limits=not args.no_limits)
    _write(sys.stdout, report.text())
    if report.messages:
        _write(sys.stderr, report.stderr())
    return 1 if report.aborted else 0
