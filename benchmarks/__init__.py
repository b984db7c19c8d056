"""seqtrans's benchmarks, run from the repository's root through one runner:

    python -m benchmarks                  # the benchmarks, a line each
    python -m benchmarks NAME --help      # what NAME measures and its options
    python -m benchmarks NAME [ARGS...]   # run it

Each benchmark is a module of this package with a ``main(argv)``; what they share (timing,
peak memory, a training budget, the argument parser and writing results with their
provenance) is in :mod:`benchmarks.common`, and the serving benchmarks' light HTTP client in
:mod:`benchmarks.http_client`. Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
#: Modules of the package that are not benchmarks: what the benchmarks share.
SHARED = frozenset({"common", "http_client"})


def benchmarks() -> dict[str, str]:
    """Every benchmark's name and the first line of its docstring, in name order, read
    without importing them (their imports are heavy: torch, transformers, servers)."""
    found = {}
    for module in pkgutil.iter_modules([str(PACKAGE)]):
        if module.name in SHARED or module.name.startswith("_"):
            continue
        path = PACKAGE / module.name / "__init__.py" if module.ispkg else PACKAGE / f"{module.name}.py"
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        found[module.name] = doc.strip().splitlines()[0] if doc.strip() else ""
    return dict(sorted(found.items()))
