"""The ``serve`` command: its spec, read from the serving settings' fields and their
help, beside its handler; the server is :mod:`seqtrans.serving`'s."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from seqtrans.cli.arguments import DEVICE, Command, arg, finite_float
from seqtrans.errors import UsageError
from seqtrans.runtime import environment
from seqtrans.runtime.threads import parse_threads


def _workers(text: str) -> int:
    try:
        return parse_threads(text, name="--workers")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("threads", "workers")) from None


def _flag_type(name: str, default: Any) -> Any:
    if name == "workers":
        return _workers
    return finite_float if isinstance(default, float) else type(default)


def token(args: argparse.Namespace) -> str | None:
    """The bearer token: --token-file's or --token (not both), else $SEQTRANS_SERVE_TOKEN;
    None for none. A usage error names where a token that cannot be used came from."""
    if args.token is not None and args.token_file is not None:
        raise UsageError("--token and --token-file: give one of them")
    if args.token_file is not None:
        where = f"--token-file {args.token_file}"
        try:
            found: str | None = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
        if not found:
            raise UsageError(f"{where}: the file is empty")
    elif args.token is not None:
        where, found = "--token", args.token
    else:
        where, found = f"${environment.SERVE_TOKEN}", environment.serve_token()
    # a header carries printable ASCII only: any other token could never be matched
    if found is not None and not (found and found.isascii() and found.isprintable() and " " not in found):
        raise UsageError(f"{where}: a token must be non-empty printable ASCII without spaces")
    return found


def _serve_fields() -> tuple[Any, ...]:
    from dataclasses import fields

    from seqtrans.serving.settings import ServeSettings

    return fields(ServeSettings)


def _cmd_serve(args: argparse.Namespace) -> int:
    from seqtrans.serving.server import check_installed, serve
    from seqtrans.serving.settings import ServeSettings

    bearer = token(args)
    check_installed()  # before loading models, which takes a while
    settings = ServeSettings(**{f.name: getattr(args, f.name) for f in _serve_fields()})
    serve(args.models, settings, device=args.device, token=bearer, threads=args.threads)
    return 0


SERVE = Command(
    "serve", "Serve trained models over HTTP and WebSocket (the serve extra).",
    "Load the runs and answer requests until SIGINT or SIGTERM: GET /v1/models, POST "
    "/v1/models/NAME/predict (concurrent requests decoded together in batches), a "
    "WebSocket for simultaneous translation with models that can stream, /health, /ready, "
    "/metrics (Prometheus) and a page at /. A model is named by its run directory's name, "
    "or NAME=RUN_DIR; NAME=RUN_A,RUN_B serves an ensemble. With a token (--token-file, "
    "--token or SEQTRANS_SERVE_TOKEN), requests need 'Authorization: Bearer TOKEN'. On SIGTERM "
    "it stops accepting, answers what is in flight and exits 0. Needs pip install "
    "'seqtrans[serve]'; see docs/serving.md.",
    (arg("models", nargs="+", metavar="RUN_DIR",
         help="Runs to serve: RUN_DIR, NAME=RUN_DIR, or NAME=RUN_A,RUN_B (an ensemble)."),
     *(arg("--" + f.name.replace("_", "-"), type=_flag_type(f.name, f.default),
           default=f.default, metavar=f.name.upper(), help=f.metadata["help"])
       for f in _serve_fields()),
     arg("--token-file", metavar="FILE",
         help="Read the bearer token that every route but /, /health and /ready then needs from FILE "
              "(white space around it dropped); preferred to --token. Either flag (not both) wins over "
              "$SEQTRANS_SERVE_TOKEN. A missing or empty file is an error."),
     arg("--token", metavar="TOKEN",
         help="The bearer token itself; other users of the machine can read it in the process list "
              "(ps), so prefer --token-file or $SEQTRANS_SERVE_TOKEN. Wins over "
              "$SEQTRANS_SERVE_TOKEN."),
     DEVICE),
    handler=_cmd_serve,
)
