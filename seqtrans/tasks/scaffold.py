"""``seqtrans new-task NAME``: a task plugin package to start from, written from the
templates in ``seqtrans/templates/new_task/``.

The package is a complete plugin as docs/plugins.md describes one: ``pyproject.toml``
with the ``seqtrans.tasks`` entry point, the task module (a toy that reverses the
letters of short words, with built-in data, scored by the character error rate), its
tests, a README and ``py.typed``. As written it passes its own ``pytest`` (the contract
check among them) and ``mypy``, and ``seqtrans run NAME`` trains it in seconds.
"""

from __future__ import annotations

import keyword
import string
from importlib import resources
from pathlib import Path

from seqtrans import __version__
from seqtrans.errors import UsageError
from seqtrans.tasks.discovery import installed as installed_tasks

#: Template (under ``templates/new_task``) -> the file it becomes, ``$package`` the module.
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "package/__init__.py.tmpl": "$package/__init__.py",
    "tests/test_task.py.tmpl": "tests/test_$name.py",
}


def names(name: str) -> dict[str, str]:
    """What the templates name: the task, its class prefix, module, distribution, and the
    range of seqtrans whose contract the package is written against."""
    major, minor = (int(part) for part in __version__.split(".")[:2])
    return {
        "name": name,
        "Name": "".join(part.capitalize() for part in name.split("_")),
        "package": f"seqtrans_{name}",
        "dist": f"seqtrans-{name.replace('_', '-')}",
        "requires": f"seqtrans>={major}.{minor},<{major}.{minor + 1}",
    }


def check_name(name: str, installed: set[str]) -> None:
    """Refuse a NAME that cannot be a task's: not a lowercase identifier, a Python keyword,
    or the name of an installed task (two plugins of one name are an error)."""
    if not name.isidentifier() or not name.isascii() or keyword.iskeyword(name):
        raise UsageError(f"{name!r} is not a task name: use a Python identifier (letters, "
                         "digits and underscores, not starting with a digit), such as g2p or my_task")
    if name != name.lower() or name.startswith("_"):
        raise UsageError(f"{name!r}: a task name is lower case and starts with a letter "
                         f"(it becomes the module seqtrans_{name.lower().lstrip('_')})")
    if name in installed:
        raise UsageError(f"a task named '{name}' is already installed ('seqtrans tasks' lists "
                         "it); choose another name")


def new_task(name: str, *, directory: str | Path | None = None,
             installed: set[str] | None = None) -> list[Path]:
    """Write the plugin package of task ``name`` into ``directory`` (default
    ``./seqtrans-NAME``), which must not exist or be empty; returns the files written.
    ``installed`` is the set of task names taken (default: the installed tasks')."""
    check_name(name, set(installed_tasks()) if installed is None else installed)
    values = names(name)
    target = Path(directory) if directory is not None else Path(values["dist"])
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} already exists and is not an empty directory; "
                         "give --dir a new or empty one")
    templates = resources.files("seqtrans") / "templates" / "new_task"
    written = []
    for source, dest in FILES.items():
        text = string.Template(templates.joinpath(source).read_text(encoding="utf-8")).substitute(values)
        path = target / string.Template(dest).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    typed = target / values["package"] / "py.typed"
    typed.write_text("", encoding="utf-8")  # the package's types are part of its API (PEP 561)
    return [*written, typed]
