"""Commands about task plugins: ``tasks`` (those installed) and ``new-task`` (a plugin
package to start from). Each spec sits beside its handler."""

from __future__ import annotations

import argparse
from pathlib import Path

from seqtrans.cli.arguments import Command, arg
from seqtrans.errors import SeqtransError


def _cmd_tasks(args: argparse.Namespace) -> int:
    from seqtrans import tasks
    from seqtrans.tasks.discovery import load_entry

    found = tasks.installed()
    if not found:
        print("no tasks installed (pip install a plugin such as plugins/copy)")
        return 0
    rows = [("TASK", "DISTRIBUTION", "VERSION", "STATUS")]
    for name in sorted(found):
        for entry in found[name]:
            if len(found[name]) > 1:
                status = "error: name offered by several distributions"
            else:
                try:
                    load_entry(entry)
                    status = "ok"
                except SeqtransError as exc:
                    status = f"error: {exc}"
            rows.append((name, entry.distribution, entry.version, status))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    return 0


TASKS = Command(
    "tasks", "List installed tasks with their distribution, version and load status.",
    "List the tasks registered under the 'seqtrans.tasks' entry-point group.",
    handler=_cmd_tasks,
)


def _cmd_new_task(args: argparse.Namespace) -> int:
    from seqtrans.tasks.scaffold import new_task

    for path in new_task(args.name, directory=args.dir):
        print(f"wrote {path}")
    return 0


NEW_TASK = Command(
    "new-task", "Write a new task plugin package to start from.",
    "Write DIR (default: ./seqtrans-NAME): pyproject.toml registering the task under the "
    "'seqtrans.tasks' entry point, the task module (a toy that reverses the letters of short "
    "words, with built-in data, scored by the character error rate), its tests, a README "
    "and py.typed. As written it passes its own pytest and mypy, and after 'pip install -e "
    "DIR' 'seqtrans run NAME' trains it in seconds. See docs/plugins.md.",
    (arg("name", metavar="NAME", help="The task's name: a lower-case Python identifier that no "
                                      "installed task has."),
     arg("--dir", type=Path, help="Where to write the package (must not exist, or be empty).")),
    handler=_cmd_new_task,
)
