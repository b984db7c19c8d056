"""Runs saved by earlier versions of seqtrans or of a task's plugin: converted when
loaded, or for good.

A task class with the :class:`~seqtrans.tasks.Upgrading` ability converts the settings
and weights its earlier versions saved. Then the engine drops the options of its own
sections (``model``, ``train``, ``decode``) that it no longer has, when they were off
(false, zero or empty: such an option added nothing to the model); one that was on
and that the task did not convert is an error naming it. Loading a run for decoding converts it in
memory (:func:`upgrade_checkpoint`), so old runs decode as they did; continuing the
training of one needs its files converted first, which ``seqtrans upgrade RUN_DIR``
(:func:`upgrade_run`) does: ``config.json`` and every checkpoint, each file replaced
whole (written beside it, then renamed), so an interrupted upgrade leaves every file
either old or new and can be run again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from seqtrans import tasks
from seqtrans.config import DecodeConfig, ModelConfig, TrainConfig
from seqtrans.errors import UsageError
from seqtrans.runtime import atomic
from seqtrans.tasks import Upgrading

_SECTIONS = {"model": ModelConfig, "train": TrainConfig, "decode": DecodeConfig}

log = logging.getLogger(__name__)


def upgrade_config(config: dict[str, Any], weights: dict[str, Any] | None = None) -> list[str]:
    """Convert in place a saved run config (and, when given, a checkpoint's model
    weights) with its task's upgrade; the changes made, empty when it is current or
    its task has no upgrade."""
    name = config.get("task")
    if not isinstance(name, str):
        return []
    task_cls = tasks.load(name)
    changes = []
    if isinstance(task_cls, Upgrading):
        changes = task_cls.upgrade(config, {} if weights is None else weights)
    return changes + _drop_retired(config, name)


def _drop_retired(config: dict[str, Any], task: str) -> list[str]:
    """Drop the engine's options that no longer exist and were off; refuse those that were on."""
    changes = []
    for section, cls in _SECTIONS.items():
        saved = config.get(section)
        if not isinstance(saved, dict):
            continue
        known = {f.name for f in dataclasses.fields(cls)}
        for key in [k for k in saved if k not in known]:
            setting = f"{section}.{key}={json.dumps(saved[key])}"
            if saved[key] not in (False, 0, "", None):
                raise UsageError(f"this run was saved with {setting}, an option this version of seqtrans no "
                                 f"longer has, and task '{task}' does not convert it")
            del saved[key]
            changes.append(f"{setting} dropped: seqtrans no longer has the option, and it was off")
    return changes


def upgrade_checkpoint(payload: dict[str, Any], *, origin: Path) -> list[str]:
    """Convert a loaded checkpoint in memory; logs what changed."""
    changes = upgrade_config(payload["config"], payload["model"])
    if changes:
        log.info("%s: saved by an earlier version of task '%s', converted as it loads (%s); "
                 "'seqtrans upgrade' converts the run's files", origin, payload["config"]["task"], changes[0])
    return changes


def check_current(directory: Path) -> None:
    """Raise :class:`UsageError` pointing to ``seqtrans upgrade`` when the run in
    ``directory`` was saved by an earlier version of its task and must be converted
    before its training continues."""
    path = directory / "config.json"
    if not path.is_file():
        return
    saved = json.loads(path.read_text(encoding="utf-8"))
    changes = upgrade_config(saved)
    if changes:
        raise UsageError(f"{directory} was saved by an earlier version of task '{saved.get('task')}' "
                         f"({changes[0]}); convert it with 'seqtrans upgrade {directory}', then continue it")


def upgrade_run(directory: str | Path) -> list[str]:
    """Convert a run directory's ``config.json`` and checkpoints for good; a line per
    file changed, empty when the run is current."""
    from seqtrans.training import checkpoint  # torch, only when there is work to do

    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise UsageError(f"{directory}: not a run directory (no config.json)")
    try:
        saved = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{config_path}: cannot be read as a run config: {exc}") from None
    done = []
    for path in sorted((directory / "checkpoints").glob("*.pt")):
        payload = checkpoint.load(path)
        changes = upgrade_config(payload["config"], payload["model"])
        if changes:
            payload.pop("digest", None)
            checkpoint.save_atomic(payload, path)
            done.append(f"{path}: {'; '.join(changes)}")
    changes = upgrade_config(saved)
    if changes:
        atomic.write_json(config_path, saved)
        done.append(f"{config_path}: {'; '.join(changes)}")
    return done

