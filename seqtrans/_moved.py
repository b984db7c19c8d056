"""Modules that moved into packages in 0.2, importable under their old names for one
release with a :class:`DeprecationWarning` (a plugin written against 0.1 keeps working).

The old name and the new are one module object, so attributes set on either (a test's
monkeypatch, say) are seen through both. :data:`MOVED` is the map a plugin author reads
to update an import; docs/design.md lists the packages.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: Old module name -> its place since 0.2.
MOVED = {
    "seqtrans.dropout": "seqtrans.model.dropout",
    "seqtrans.masks": "seqtrans.model.masks",
    "seqtrans.extension": "seqtrans.model.extension",
    "seqtrans.quantize": "seqtrans.linear.quantize",
    "seqtrans.precision": "seqtrans.linear.precision",
    "seqtrans.binarized": "seqtrans.prepare.binarized",
    "seqtrans.distributed": "seqtrans.training.distributed",
    "seqtrans.world": "seqtrans.training.world",
    "seqtrans.plot": "seqtrans.training.plot",
    "seqtrans.upgrade": "seqtrans.training.upgrade",
    "seqtrans.training.checkpointer": "seqtrans.training.resumption",
    "seqtrans.system": "seqtrans.runtime.system",
    "seqtrans.threads": "seqtrans.runtime.threads",
    "seqtrans.timing": "seqtrans.runtime.timing",
    "seqtrans.environment": "seqtrans.runtime.environment",
    "seqtrans.atomic": "seqtrans.runtime.atomic",
    "seqtrans.download": "seqtrans.runtime.download",
    "seqtrans.vocab": "seqtrans.data.vocab",
    "seqtrans.encoding": "seqtrans.data.encoding",
    "seqtrans.assets": "seqtrans.data.assets",
    "seqtrans.decoding.shortlist": "seqtrans.shortlist.search",
    "seqtrans.inference.shortlists": "seqtrans.shortlist.build",
    "seqtrans.decoding.streaming": "seqtrans.streaming.decoder",
    "seqtrans.decoding.latency": "seqtrans.streaming.latency",
    "seqtrans.inference.session": "seqtrans.streaming.session",
    "seqtrans.inference.streaming": "seqtrans.streaming.predict",
    "seqtrans.inference.simultaneous": "seqtrans.streaming.evaluation",
    "seqtrans.inference.policy": "seqtrans.streaming.policy",
    "seqtrans.simuleval": "seqtrans.streaming.simuleval",
    "seqtrans.serving.streaming": "seqtrans.streaming.websocket",
    "seqtrans.formats": "seqtrans.inference.formats",
    "seqtrans.distill": "seqtrans.inference.distill",
    "seqtrans.scaffold": "seqtrans.tasks.scaffold",
    "seqtrans.testing": "seqtrans.tasks.testing",
}
# seqtrans.model, seqtrans.data and seqtrans.shortlist became packages of the same name:
# their old names are forwarded by the packages themselves (:func:`forwarding`).


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in seqtrans 0.2; the old name goes in 0.3",
                  DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran when it was imported


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new)) if new else None


def install() -> None:
    """Let the old names import (called once, by ``seqtrans/__init__``)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def forwarding(package: str, old: str, new: str, *, warn: bool = True) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that serves the names of the module the package
    replaced (``old``, now ``new``), with the deprecation warning where ``warn``. The
    package's own submodules come first: ``from package import submodule`` asks this
    before it imports the submodule."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
        module = importlib.import_module(new)
        if not hasattr(module, name):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if warn:
            _warn(f"{old}.{name}", f"{new}.{name}")
        return getattr(module, name)

    return __getattr__


#: Names that had more than one import path -> the one path that stays; the others
#: warn until 0.3 (:func:`old_path`).
ONE_PATH = {
    "seqtrans.tasks.resolve_config": "seqtrans.resolve_config",
    "seqtrans.pipeline.resolve_config": "seqtrans.resolve_config",
    "seqtrans.pipeline.initial": "seqtrans.initial",
    "seqtrans.pipeline.with_initial_model": "seqtrans.with_initial_model",
    "seqtrans.pipeline.vocabulary_of": "seqtrans.vocabulary_of",
}


def old_path(module: str, name: str, value: Any) -> Any:
    """``value``, which ``module.name`` names for one release more (:data:`ONE_PATH`), with
    a :class:`DeprecationWarning` that names its one path; for a module's ``__getattr__``."""
    warnings.warn(f"{module}.{name} is deprecated: use {ONE_PATH[f'{module}.{name}']} (the old path goes "
                  "in 0.3)", DeprecationWarning, stacklevel=3)
    return value
