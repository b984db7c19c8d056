"""A task's run configuration: the layers of :func:`seqtrans.config.resolve` filled in
with the options class, defaults and presets of the task's plugin.

It lives here, above both :mod:`seqtrans.config` and the plugin discovery, so that the
configuration package never imports the tasks (whose protocol imports the config).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from seqtrans.config import RunConfig, resolve
from seqtrans.tasks.discovery import load


def resolve_config(task: str, *, preset: str | None = None, config_file: str | Path | None = None,
                   overrides: Iterable[str] = ()) -> RunConfig:
    """The fully resolved configuration of a run of ``task`` (see :mod:`seqtrans.config`)."""
    task_cls = load(task)
    return resolve(task, data_cls=task_cls.Config, task_defaults=task_cls.defaults,
                   task_presets=task_cls.presets, preset=preset, config_file=config_file,
                   overrides=overrides)
