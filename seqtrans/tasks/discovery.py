"""Finding plugins through entry points: tasks in ``seqtrans.tasks``, extra
command-line commands in ``seqtrans.commands``.

Entry points are the registry: listing reads the installed distributions' metadata
without importing anything; a task's module is imported only when it is used. A
plugin that fails to import is reported with its name and distribution and does not
affect the others. Two distributions offering the same task name is an error for
that name, never a silent shadow. Only installed distributions count: the working
directory, which ``python -m`` puts first on ``sys.path``, is not searched, so a
``*.dist-info`` folder that lies there (in a data directory, an unpacked archive) cannot
register a plugin.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import entrypoints

from seqtrans.errors import TaskError
from seqtrans.tasks.protocol import TaskClass, missing_members

GROUP = "seqtrans.tasks"
COMMAND_GROUP = "seqtrans.commands"


@dataclass(frozen=True)
class TaskEntry:
    """One installed plugin object (a task, or a command), as its distribution's
    metadata describes it."""

    name: str
    distribution: str
    version: str
    target: str  # "module:object"

    @property
    def label(self) -> str:
        return f"'{self.name}' (from {self.distribution} {self.version})"


def search_path() -> list[str]:
    """``sys.path`` without the working directory that ``python -m`` or ``-c`` put first."""
    path = list(sys.path)
    if path and path[0] in ("", os.getcwd()):
        del path[0]
    return path


def installed(path: Sequence[str] | None = None, *, group: str = GROUP) -> dict[str, list[TaskEntry]]:
    """Every name in ``group`` with the entries offering it (more than one means a clash).

    ``path`` defaults to :func:`search_path`; tests pass their own.
    """
    found: dict[str, list[TaskEntry]] = {}
    folders = list(path) if path is not None else search_path()
    for ep in entrypoints.get_group_all(group, path=folders):
        distro = ep.distro
        entry = TaskEntry(
            name=ep.name,
            distribution=_project_name(getattr(distro, "name", None), folders) or "<unknown distribution>",
            version=getattr(distro, "version", None) or "?",
            target=f"{ep.module_name}:{ep.object_name}" if ep.object_name else ep.module_name,
        )
        entries = found.setdefault(ep.name, [])
        if entry not in entries:  # the same distribution seen twice on the path
            entries.append(entry)
    return found


def _project_name(folder_name: str | None, path: list[str]) -> str | None:
    """The distribution's name as its metadata spells it (``seqtrans-copy``): ``entrypoints``
    gives the name of its ``.dist-info`` folder, which packaging tools normalise
    (``seqtrans_copy``)."""
    if not folder_name:
        return None
    for dist in importlib.metadata.distributions(path=path, name=folder_name):
        return str(dist.metadata["Name"] or folder_name)
    return folder_name


def find(name: str, path: Sequence[str] | None = None) -> TaskEntry:
    """The entry of task ``name``; an error lists the available names or the clash."""
    tasks = installed(path)
    if name not in tasks:
        available = ", ".join(sorted(tasks)) or "none (install a plugin such as seqtrans-copy)"
        raise TaskError(f"unknown task '{name}'; installed tasks: {available}")
    entries = tasks[name]
    if len(entries) > 1:
        offered = ", ".join(f"{e.distribution} {e.version} ({e.target})" for e in entries)
        raise TaskError(
            f"task name '{name}' is offered by {len(entries)} distributions: {offered}; "
            "uninstall or rename one"
        )
    return entries[0]


def load(name: str, path: Sequence[str] | None = None) -> TaskClass[Any, Any, Any]:
    """Import and check the task class registered as ``name``."""
    entry = find(name, path)
    return load_entry(entry)


def load_object(entry: TaskEntry, *, kind: str = "task") -> object:
    """Import the object an entry names; a failure names the plugin and its distribution."""
    module_name, _, object_name = entry.target.partition(":")
    ep = entrypoints.EntryPoint(entry.name, module_name, object_name or None)
    try:
        return ep.load()
    except Exception as exc:  # a broken plugin must not take the engine down with it
        raise TaskError(
            f"{kind} {entry.label} failed to load from {entry.target}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def load_entry(entry: TaskEntry) -> TaskClass[Any, Any, Any]:
    """Import a task class and check that it has every member of the contract."""
    task = load_object(entry)
    missing = missing_members(task)
    if missing:
        raise TaskError(
            f"task {entry.label}: {entry.target} does not implement the Task protocol; "
            f"missing: {', '.join(missing)}"
        )
    task_cls = cast(TaskClass[Any, Any, Any], task)
    if task_cls.name != entry.name:
        raise TaskError(
            f"task {entry.label}: registered as '{entry.name}' but its class is named '{task_cls.name}'"
        )
    return task_cls
