"""Model formats of other toolkits that plugins offer, found through the
``seqtrans.formats`` entry-point group (as tasks are, :mod:`seqtrans.tasks.discovery`).

A format converts a model of another toolkit into a seqtrans run directory
(``seqtrans import FORMAT DIR --out RUN_DIR``) and a trained run back
(``seqtrans export RUN_DIR --to FORMAT OUT``). It lives in the plugin whose task the
models belong to, since it must write and read that task's vocabulary files; the
engine knows formats only by the names their plugins register. CTranslate2 is the
engine's own export (:mod:`seqtrans.inference.export`) and is not listed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from seqtrans.errors import TaskError, UsageError
from seqtrans.tasks import discovery

if TYPE_CHECKING:
    from seqtrans.inference.loading import Loaded

GROUP = "seqtrans.formats"


@runtime_checkable
class ModelFormat(Protocol):
    """What a plugin registers under ``seqtrans.formats``."""

    def import_model(self, source: Path, *, out: Path, allow_pickle: bool = False) -> Path:
        """Write the model of directory ``source`` as the new run directory ``out``
        (whole or not at all) and return it. A pickled weight file is read only where
        ``allow_pickle`` (``--allow-pickle``): loading a pickle can run code."""
        ...

    def export_model(self, loaded: Loaded, *, out: Path) -> Path:
        """Write a loaded run in this format as the new directory ``out`` (whole or not at
        all) and return it."""
        ...


def names() -> list[str]:
    """The installed formats' names, without importing them."""
    return sorted(discovery.installed(group=GROUP))


def load(name: str) -> ModelFormat:
    """Import the format registered as ``name``; an error names the installed ones or the clash."""
    found = discovery.installed(group=GROUP)
    if name not in found:
        raise UsageError(
            f"unknown model format '{name}'; installed formats: {', '.join(sorted(found)) or 'none'}"
        )
    entries = found[name]
    if len(entries) > 1:
        offered = ", ".join(f"{e.distribution} {e.version} ({e.target})" for e in entries)
        raise TaskError(f"model format '{name}' is offered by {len(entries)} distributions: {offered}")
    obj = discovery.load_object(entries[0], kind="model format")
    if not isinstance(obj, ModelFormat):
        raise TaskError(
            f"model format {entries[0].label}: {entries[0].target} has no import_model and export_model"
        )
    return obj
