"""The ``serve`` command: its spec, read from the serving settings' fields and their
help, beside its handler; the server is :mod:`seqtrans.serving`'s."""

from __future__ import annotations

import argparse
from typing import Any

from seqtrans.cli.arguments import DEVICE, Command, arg
from seqtrans.errors import UsageError
from seqtrans.runtime import environment
from seqtrans.runtime.threads import parse_threads


def _workers(text: str) -> int:
    try:
        return parse_threads(text, name="--workers")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("threads", "workers")) from None


def _serve_fields() -> tuple[Any, ...]:
    from dataclasses import fields

    from seqtrans.serving.settings import ServeSettings

    return fields(ServeSettings)


def _cmd_serve(args: argparse.Namespace) -> int:
    from seqtrans.serving.server import check_installed, serve
    from seqtrans.serving.settings import ServeSettings

    check_installed()  # before loading models, which takes a while
    settings = ServeSettings(**{f.name: getattr(args, f.name) for f in _serve_fields()})
    serve(args.models, settings, device=args.device, token=environment.serve_token(), threads=args.threads)
    return 0


SERVE = Command(
    "serve", "Serve trained models over HTTP and WebSocket (the serve extra).",
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
     DEVICE),
    handler=_cmd_serve,
)
