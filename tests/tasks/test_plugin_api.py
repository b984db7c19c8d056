"""``seqtrans.plugin`` is the one module a plugin imports: every name resolves to the engine
object it names, importing it loads no torch, and the built-in plugins import engine
names from it and ``seqtrans`` alone, as a third party's plugin would. Their tests do
too, except the few imports marked ``# internal: WHY`` that look inside the engine: counted,
and never for a name the public API offers."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import seqtrans
import seqtrans.plugin
from conftest import ROOT

PLUGINS = ROOT / "plugins"
#: The modules a plugin may import engine names from.
PUBLIC = {"seqtrans", "seqtrans.plugin"}
MARK = "# internal:"


def engine_imports(path: Path) -> list[tuple[int, str]]:
    """Each import of an engine module that is not public in ``path`` (anywhere in it,
    ``TYPE_CHECKING`` blocks and functions too): its line and what it imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from seqtrans import config` names a module, not a public name of the package
            names = [node.module] if node.module != "seqtrans" else [
                f"seqtrans.{alias.name}" for alias in node.names if alias.name not in seqtrans.__all__
                or alias.name == "tasks"]
        else:
            continue
        found += [(node.lineno, name) for name in names
                  if (name == "seqtrans" or name.startswith("seqtrans.")) and name not in PUBLIC]
    return found


def _sources(kind: str) -> list[Path]:
    folders = sorted(PLUGINS.glob("*/seqtrans_*") if kind == "package" else PLUGINS.glob("*/tests"))
    return [path for folder in folders for path in sorted(folder.rglob("*.py"))]


def test_every_name_resolves_to_the_engine_object_and_the_module_loads_no_torch() -> None:
    assert dir(seqtrans.plugin) == sorted(seqtrans.plugin.__all__)
    for name, module in seqtrans.plugin._API.items():
        assert getattr(seqtrans.plugin, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        seqtrans.plugin.Trainer  # noqa: B018
    # check_task builds models: a plugin's tests import it, its task module does not
    code = ("import sys; from seqtrans.plugin import Example, Vocab, option, fetch, ConfigError, TaskClass\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_names_are_the_modules_typed_imports() -> None:
    """The map the names load from and the imports mypy reads (``if TYPE_CHECKING:``; a
    ``*`` imports the module's ``__all__``) are the same."""
    tree = ast.parse(Path(seqtrans.plugin.__file__).read_text(encoding="utf-8"))
    typing_block = next(node for node in tree.body if isinstance(node, ast.If)
                        and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    typed: dict[str, str] = {}
    for node in ast.walk(typing_block):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names = (importlib.import_module(node.module).__all__ if alias.name == "*"
                         else [alias.asname or alias.name])
                typed.update(dict.fromkeys(names, node.module))
    assert typed == seqtrans.plugin._API


def test_the_checks_find_an_import_of_the_engines_insides(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text("import seqtrans\nfrom seqtrans import run, config\nfrom seqtrans.plugin import Vocab\n"
                    "def f():\n    from seqtrans.data.vocab import EOS\n    import seqtrans.tasks\n")
    assert engine_imports(path) == [(2, "seqtrans.config"), (5, "seqtrans.data.vocab"), (6, "seqtrans.tasks")]


@pytest.mark.parametrize("path", _sources("package"), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_a_built_in_plugin_imports_only_the_public_api(path: Path) -> None:
    assert engine_imports(path) == [], "import these names from seqtrans.plugin (or seqtrans)"


def test_a_built_in_plugins_test_marks_each_look_inside_the_engine() -> None:
    unmarked = []
    for path in _sources("tests"):
        lines = path.read_text(encoding="utf-8").splitlines()
        unmarked += [f"{path.relative_to(PLUGINS)}:{line}: {name}" for line, name in engine_imports(path)
                     if MARK not in lines[line - 1]]
    assert unmarked == [], f"import from seqtrans.plugin or seqtrans, or say why with '{MARK} WHY'"


#: How many marked imports of the engine's insides the built-in plugins' tests make at most: a
#: ceiling that only comes down (lower it when one goes; a new one wants a public name first).
MARKED_AT_MOST = 25


def _marked_imports() -> list[tuple[Path, ast.ImportFrom | ast.Import]]:
    marked = []
    for path in _sources("tests"):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and MARK in lines[node.lineno - 1]:
                marked.append((path, node))
    return marked


def test_the_plugins_tests_look_inside_the_engine_rarely_and_never_for_a_public_name() -> None:
    marked = _marked_imports()
    assert len(marked) <= MARKED_AT_MOST, [f"{p.relative_to(PLUGINS)}:{n.lineno}" for p, n in marked]
    public = {name: getattr(seqtrans, name) for name in seqtrans.__all__ if name != "tasks"}
    public.update({name: getattr(seqtrans.plugin, name) for name in seqtrans.plugin.__all__})
    needless = []
    for path, node in marked:
        if isinstance(node, ast.ImportFrom) and node.module and node.module not in PUBLIC:
            module = importlib.import_module(node.module)
            needless += [f"{path.relative_to(PLUGINS)}:{node.lineno}: {alias.name}" for alias in node.names
                         if alias.name in public and getattr(module, alias.name, None) is public[alias.name]]
    assert needless == [], "public names: import them from seqtrans or seqtrans.plugin"


def test_the_reference_names_every_public_name_and_has_a_section_per_ability() -> None:
    from seqtrans.tasks.abilities import ABILITIES

    page = (ROOT / "docs" / "plugin-contract.md").read_text(encoding="utf-8")
    each = (ROOT / "docs" / "plugin-abilities.md").read_text(encoding="utf-8")
    assert [name for name in seqtrans.plugin.__all__ if f"`{name}" not in page] == []
    assert [a.name for a in ABILITIES if f"\n## `{a.name}`\n" not in each] == []


def test_resolve_config_has_one_path_and_the_old_ones_warn() -> None:
    code = ("import warnings, seqtrans\n"
            "for module in ('seqtrans.tasks', 'seqtrans.pipeline'):\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        warnings.simplefilter('always')\n"
            "        old = getattr(__import__(module, fromlist=['x']), 'resolve_config')\n"
            "    print(old is seqtrans.resolve_config, caught[0].category.__name__, caught[0].message)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        f"True DeprecationWarning {module}.resolve_config is deprecated: use seqtrans.resolve_config "
        "(the old path goes in 0.3)" for module in ("seqtrans.tasks", "seqtrans.pipeline")]
    assert "resolve_config" not in seqtrans.tasks.__all__
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        seqtrans.tasks.nothing  # noqa: B018
