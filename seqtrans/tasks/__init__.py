"""Task plugins: the contract they keep (:mod:`.protocol`, the optional abilities in
:mod:`.abilities`), their discovery through entry points (:mod:`.discovery`) and a
task's run configuration (:mod:`.configuration`). A plugin imports these names from
:mod:`seqtrans.plugin`, the one module of the plugin API; the engine imports them from
here. Importing this package imports no torch."""

from typing import Any

from seqtrans import _moved
from seqtrans.tasks import protocol
from seqtrans.tasks.discovery import GROUP, TaskEntry, find, installed, load
from seqtrans.tasks.protocol import *  # noqa: F403 (the contract's names, listed once: protocol.__all__)

__all__ = ["GROUP", "TaskEntry", "find", "installed", "load"]
__all__ += protocol.__all__


def __getattr__(name: str) -> Any:
    if name != "resolve_config":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # its one path is seqtrans.resolve_config; this one warns until 0.3
    from seqtrans.tasks.configuration import resolve_config

    return _moved.old_path(__name__, name, resolve_config)
