"""A plugin command as a test fixture: prints its arguments in capitals."""

from __future__ import annotations

import argparse

from seqtrans.errors import DataError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="seqtrans shout")
    parser.add_argument("words", nargs="*")
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args(argv)
    if args.fail:
        raise DataError("words.txt", 3, "not loud enough")
    print(" ".join(w.upper() for w in args.words))
    return 0
