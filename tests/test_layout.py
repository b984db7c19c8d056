"""The package layout's promises: inference never loads the training orchestrator, no
import cycle between modules of ``seqtrans/``, and each module imports only from its own
layer or those below it (docs/design.md, "Layers").

An import inside a function counts as much as one at the top of a module: hiding an
import in a function hides the dependency, it does not remove it. So the graph is built
from the syntax tree of every module, every ``import`` statement wherever it stands
(``if TYPE_CHECKING:`` blocks too), relative imports resolved, and ``from pkg import
name`` counted as an import of ``pkg.name`` where that is a module.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

import seqtrans
import seqtrans.inference

PACKAGE = Path(seqtrans.__file__).parent

#: The layers, lowest first: a module may import modules of its own layer and of the
#: layers below. A module belongs to the entry naming the longest prefix of its name;
#: ``seqtrans`` alone is the package's ``__init__``. Keep docs/design.md in step.
LAYERS: tuple[tuple[str, ...], ...] = (
    # what a process runs on, and the packages' own __init__ modules (docstrings only)
    ("seqtrans.errors", "seqtrans._moved", "seqtrans.runtime", "seqtrans.data", "seqtrans.data.assets",
     "seqtrans.model", "seqtrans.model.masks", "seqtrans.model.dropout", "seqtrans.linear.precision",
     "seqtrans.training.world", "seqtrans.tasks.testing", "seqtrans.prepare.binarized",
     "seqtrans.streaming", "seqtrans.shortlist"),
    ("seqtrans.config", "seqtrans.data.vocab", "seqtrans.shortlist.table"),
    ("seqtrans.native", "seqtrans.linear", "seqtrans.training.distributed"),
    ("seqtrans.attention", "seqtrans.model.extension", "seqtrans.model.norms"),
    # the task contract, and what reads a task's examples into ids; a task's constraint
    # (decoding.constraints) is part of the contract, free of the search
    ("seqtrans.tasks", "seqtrans.decoding.constraints", "seqtrans.data.encoding", "seqtrans.data.batches"),
    ("seqtrans.model.transformer", "seqtrans.model.layers", "seqtrans.model.state",
     "seqtrans.linear.quantize", "seqtrans.linear.native_step", "seqtrans.tasks.contract"),
    ("seqtrans.decoding", "seqtrans.shortlist.search", "seqtrans.streaming.decoder",
     "seqtrans.streaming.reencoding", "seqtrans.streaming.latency"),
    ("seqtrans.training", "seqtrans.prepare"),
    ("seqtrans.inference", "seqtrans.shortlist.build", "seqtrans.streaming.session",
     "seqtrans.streaming.predict", "seqtrans.streaming.evaluation", "seqtrans.streaming.policy",
     "seqtrans.streaming.simuleval", "seqtrans.training.plot",
     "seqtrans.training.initial"),
    ("seqtrans.serving", "seqtrans.streaming.websocket"),
    ("seqtrans.pipeline",),
    ("seqtrans.cli", "seqtrans.__main__", "seqtrans.tasks.scaffold", "seqtrans.plugin", "seqtrans"),
)


def module_name(path: Path, root: Path) -> str:
    """``a/b/c.py`` -> ``a.b.c`` and ``a/b/__init__.py`` -> ``a.b`` (relative to ``root``'s parent)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement may import; ``package`` resolves relative ones."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports."""
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in imported_names(node, package):
                while target and target not in modules:  # an object of a module: the module
                    target = target.rpartition(".")[0]
                # importing a module imports its packages first: those edges are not dependencies
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The index of the layer whose longest prefix names ``module``; None if none does."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for number, prefixes in enumerate(layers):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), number)
    return None if best is None else best[1]


def upward_imports(graph: Mapping[str, set[str]],
                   layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Each import of a module from a higher layer than the importer's, as ``a -> b``."""
    bad = []
    for module, targets in sorted(graph.items()):
        own = layer_of(module, layers)
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if own is not None and theirs is not None and theirs > own:
                bad.append(f"{module} (layer {own}) -> {target} (layer {theirs})")
    return bad


def write_package(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / next(iter(files)).split("/")[0]


# ----------------------------------------------------------------------------- the package


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


def test_seqtrans_has_no_import_cycle() -> None:
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_every_module_is_in_a_layer() -> None:
    missing = sorted(m for m in import_graph(PACKAGE) if layer_of(m) is None)
    assert not missing, f"modules in no layer of LAYERS (add them, and to docs/design.md): {missing}"


def test_modules_import_only_their_own_layer_or_lower() -> None:
    bad = upward_imports(import_graph(PACKAGE))
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_design_doc_names_every_layer() -> None:
    design = (PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8")
    section = design[design.index("## Layers"):]
    for prefixes in LAYERS:
        for prefix in prefixes:
            if prefix != "seqtrans":
                shown = prefix.removeprefix("seqtrans.")
                assert f"`{shown}`" in section, f"docs/design.md's Layers section does not name `{shown}`"


# ----------------------------------------------------------------------------- the checks themselves


TOY = {
    "toy/__init__.py": "",
    "toy/a.py": "from toy import b\n",
    "toy/b.py": "def later():\n    from .sub import c  # hidden in a function: still an edge\n",
    "toy/sub/__init__.py": "",
    "toy/sub/c.py": "import toy.a\n",
    "toy/d.py": "from toy.sub.c import something\n",  # imports into the cycle, not part of it
}


def test_a_cycle_through_a_function_local_relative_import_is_found(tmp_path: Path) -> None:
    root = write_package(tmp_path, TOY)
    graph = import_graph(root)
    assert graph["toy.b"] == {"toy.sub", "toy.sub.c"} and graph["toy.d"] == {"toy.sub.c"}
    assert cycles(graph) == [["toy.a", "toy.b", "toy.sub.c"]]


def test_a_package_importing_its_submodules_is_no_cycle(tmp_path: Path) -> None:
    root = write_package(tmp_path, {
        "toy/__init__.py": "from toy.a import f\nfrom . import b\n",
        "toy/a.py": "def f():\n    pass\n",
        "toy/b.py": "from toy import a\n",  # a child importing through its package: to toy.a, not toy
    })
    graph = import_graph(root)
    assert graph["toy"] == {"toy.a", "toy.b"} and graph["toy.b"] == {"toy.a"}
    assert cycles(graph) == []
    write_package(tmp_path, {"toy/a.py": "import toy.b\nfrom toy.b import g\n",
                             "toy/b.py": "from toy import a\ndef g():\n    pass\n"})
    assert cycles(import_graph(root)) == [["toy.a", "toy.b"]]


def test_a_type_checking_import_counts(tmp_path: Path) -> None:
    root = write_package(tmp_path, {
        "toy/__init__.py": "",
        "toy/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy.b import B\n",
        "toy/b.py": "from toy.a import A\n",
    })
    assert cycles(import_graph(root)) == [["toy.a", "toy.b"]]


def test_an_import_from_a_higher_layer_is_reported(tmp_path: Path) -> None:
    root = write_package(tmp_path, {
        "toy/__init__.py": "",
        "toy/low.py": "def f():\n    from toy.high.top import g\n",
        "toy/high/__init__.py": "",
        "toy/high/top.py": "from toy import low\n",
        "toy/high/middle.py": "from toy.low import f\n",
    })
    layers = (("toy.low", "toy.high.middle"), ("toy.high",))
    graph = import_graph(root)
    assert layer_of("toy.high.middle", layers) == 0 and layer_of("toy.high.top", layers) == 1
    assert upward_imports(graph, layers) == ["toy.low (layer 0) -> toy.high.top (layer 1)"]


@pytest.mark.parametrize("module", ["seqtrans.decoding.constraints", "seqtrans.tasks.contract",
                                    "seqtrans.tasks.protocol", "seqtrans"])
def test_the_longest_prefix_decides_a_layer(module: str) -> None:
    expected = {"seqtrans.decoding.constraints": 4, "seqtrans.tasks.contract": 5,
                "seqtrans.tasks.protocol": 4, "seqtrans": len(LAYERS) - 1}
    assert layer_of(module) == expected[module]


def layout_entries(design: str) -> dict[str, str]:
    """docs/design.md's Layout block: each entry under ``seqtrans/`` (``name/`` for a
    package, ``name.py`` for a module) -> its text, continuation lines included."""
    block = design[design.index("## Layout"):design.index("## Layers")]
    block = block[block.index("```\n") + 4:]
    entries: dict[str, str] = {}
    name = None
    for line in block[:block.index("```")].splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition(" ")
            entries[name] = text.strip()
        elif line.startswith("   ") and name is not None:
            entries[name] += " " + line.strip()
        else:
            name = None  # seqtrans/ itself, and what lies beside it (plugins/, tests/, ...)
    return entries


def _stated_layers(text: str) -> set[int] | None:
    """The layers an entry states first, ``(layer 3)`` or ``(layers 0, 6 and 8)``."""
    found = re.match(r"\(layers? ([0-9, and]+)\)", text.strip())
    return None if found is None else {int(n) for n in re.findall(r"[0-9]+", found.group(1))}


def _layers_of_entry(name: str) -> set[int]:
    """The layers of the modules an entry of the layout holds; a package's ``__init__`` only
    where it is more than a docstring (not named on its own in layer 0)."""
    path = PACKAGE / name
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    docstring_only = {f"seqtrans.{name.rstrip('/')}"} & set(LAYERS[0])
    modules = {module_name(f, PACKAGE) for f in files} - docstring_only
    return {layer for m in modules if (layer := layer_of(m)) is not None}


def test_design_doc_layout_is_the_tree_with_each_entrys_layers() -> None:
    """docs/design.md's Layout block names each package and top-level module of
    ``seqtrans/``, and nothing that is not there; each entry starts with the layers of its
    modules, which say what it may import (its layer and those below, "Layers")."""
    entries = layout_entries((PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8"))
    tree = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    tree |= {p.name for p in PACKAGE.glob("*.py")}
    assert set(entries) == tree
    wrong = {name: (_stated_layers(text), _layers_of_entry(name)) for name, text in entries.items()
             if _stated_layers(text) != _layers_of_entry(name)}
    assert wrong == {}, "entry: (the layers docs/design.md states, its modules' layers)"


def test_the_layout_check_reads_entries_and_their_layers() -> None:
    design = ("## Layout\n```\nseqtrans/\n  a/     (layers 0, 6 and 8) one job:\n         more of it\n"
              "  b.py   (layer 3) another\nplugins/  beside\n```\n## Layers\n")
    entries = layout_entries(design)
    assert entries == {"a/": "(layers 0, 6 and 8) one job: more of it", "b.py": "(layer 3) another"}
    assert _stated_layers(entries["a/"]) == {0, 6, 8} and _stated_layers(entries["b.py"]) == {3}
    assert _stated_layers("one job (layer 3)") is None


def test_at_most_eight_top_level_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


def test_a_moved_module_imports_by_its_old_name_with_a_warning() -> None:
    code = ("import warnings; warnings.simplefilter('error')\n"
            "import seqtrans.data.vocab as new\n"
            "try:\n    import seqtrans.vocab\nexcept DeprecationWarning as w:\n    print('warned', w)\n"
            "warnings.simplefilter('ignore')\nimport seqtrans.vocab as old\n"
            "from seqtrans.data import Pairs\nfrom seqtrans.model import Transformer\n"
            "print(old is new)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "warned seqtrans.vocab moved to seqtrans.data.vocab" in out and out.strip().endswith("True")
