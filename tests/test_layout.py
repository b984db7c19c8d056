"""The package layout's promises: inference never loads the training orchestrator, and
no engine module imports another in a cycle."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import seqtrans
import seqtrans.inference

ROOT = Path(seqtrans.__file__).parent


def test_no_inference_module_imports_the_training_orchestrator() -> None:
    names = [f"seqtrans.inference.{m.name}" for m in pkgutil.iter_modules(seqtrans.inference.__path__)]
    assert {"seqtrans.inference.loading", "seqtrans.inference.online",
            "seqtrans.inference.export"} <= set(names)
    code = ("import importlib, json, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('seqtrans'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    assert "seqtrans.pipeline" not in loaded and "seqtrans.training.loop" not in loaded
    assert "seqtrans.inference.heatmaps" in loaded  # the modules were imported


def _imports(path: Path, module: str) -> set[str]:
    """The seqtrans modules ``module`` imports at import time (not inside functions or
    TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom):
                base = sub.module or ""
                if sub.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - sub.level + 1] + [base])
                found.add(base)
                found.update(f"{base}.{a.name}" for a in sub.names)
    return {m for m in found if m.startswith("seqtrans.") or m == "seqtrans"}


def test_the_engine_has_no_import_cycles() -> None:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {name: {m for m in _imports(path, name) if m in modules and m != name}
             for name, path in modules.items()}
    # a module importing a package runs the package's __init__ first, which is part of the import
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []
