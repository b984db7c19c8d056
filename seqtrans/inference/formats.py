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

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from seqtrans.errors import TaskError, UsageError
from seqtrans.tasks import discovery

if TYPE_CHECKING:
    from torch import Tensor

    from seqtrans.config import RunConfig
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


def write_run(out: Path, config: RunConfig, assets: Mapping[str, bytes], weights: Mapping[str, Tensor], *,
              imported: str) -> Path:
    """Write an imported model as the new run directory ``out``, whole or not at all (made
    beside it, then renamed): ``config.json``, the vocabulary files in ``vocab/`` and the
    weights as ``checkpoints/average.pt``, which ``imported`` describes (the format and
    the model's directory). What every format's ``import_model`` ends with."""
    # here, not at the top: listing the formats (seqtrans import --help) loads no torch
    from seqtrans import config as cfg
    from seqtrans.runtime import atomic
    from seqtrans.training import checkpoint

    settings = cfg.to_dict(config)
    payload = {"format": checkpoint.FORMAT, "config": settings, "assets": dict(assets),
               "model": dict(weights), "imported": imported}
    with atomic.new_directory(out) as scratch:
        atomic.write_json(scratch / "config.json", settings)
        (scratch / "vocab").mkdir()
        for name, data in assets.items():
            (scratch / "vocab" / name).write_bytes(data)
        checkpoint.save_atomic(payload, scratch / "checkpoints" / "average.pt")
    return out
