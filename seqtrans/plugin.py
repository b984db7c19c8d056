"""Everything a task plugin imports from seqtrans, in one module: ``from seqtrans.plugin
import Example, Vocab, option, check_task``.

Every built-in task plugin, the package ``seqtrans new-task``
writes and the plugin guide (docs/plugins.md) import engine names from here and from
``seqtrans`` itself (the operations of the command line: ``seqtrans.resolve_config``,
``seqtrans.run``, ``seqtrans.load``), and from nowhere else: the rest of the engine may
change between minor versions, this module only as CHANGELOG.md's "Plugin contract"
says. Each name is the object of the engine module that defines it (``seqtrans.tasks``,
``seqtrans.config``, ``seqtrans.data.vocab`` and the others keep working), imported on
first use: importing this module imports no torch, and the names that need it (model
extensions, constraints, model formats) load it when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from seqtrans.tasks import protocol as _protocol  # no torch: only the list of the contract's names

#: Each public name -> the engine module that defines it.
_API: dict[str, str] = {
    # the contract: a task class, its instances and its codec, the optional abilities, the
    # splits, metric modes and stream units (seqtrans.tasks.protocol's names, listed there)
    **dict.fromkeys(_protocol.__all__, "seqtrans.tasks.protocol"),
    # the table that declares the abilities
    "ABILITIES": "seqtrans.tasks.abilities",
    "Ability": "seqtrans.tasks.abilities",
    # options, and the run config a preset or an imported model sets
    "option": "seqtrans.config",
    "ModelConfig": "seqtrans.config",
    "TrainConfig": "seqtrans.config",
    "DecodeConfig": "seqtrans.config",
    "RunConfig": "seqtrans.config",
    "PRESETS": "seqtrans.config",
    "merge": "seqtrans.config",
    "to_dict": "seqtrans.config",
    "from_dict": "seqtrans.config",
    # vocabularies and the special symbols
    "Vocab": "seqtrans.data.vocab",
    "Vocabularies": "seqtrans.data.vocab",
    "SPECIALS": "seqtrans.data.vocab",
    "PAD": "seqtrans.data.vocab",
    "BOS": "seqtrans.data.vocab",
    "EOS": "seqtrans.data.vocab",
    "UNK": "seqtrans.data.vocab",
    # errors the command line prints on one line
    "SeqtransError": "seqtrans.errors",
    "ConfigError": "seqtrans.errors",
    "DataError": "seqtrans.errors",
    "UsageError": "seqtrans.errors",
    "DownloadError": "seqtrans.errors",
    # published files, and files written whole or not at all
    "fetch": "seqtrans.runtime.download",
    "extract": "seqtrans.runtime.download",
    "cache_dir": "seqtrans.runtime.download",
    "file_name": "seqtrans.runtime.download",
    "sha256_file": "seqtrans.runtime.download",
    "CACHE_ENV": "seqtrans.runtime.download",
    "MIRROR_ENV": "seqtrans.runtime.download",
    "write_bytes": "seqtrans.runtime.atomic",
    "new_directory": "seqtrans.runtime.atomic",
    # model-side parts (ModelExtending) and constraints (Constraining); these import torch
    "ModelExtension": "seqtrans.model.extension",
    "ExtensionError": "seqtrans.model.extension",
    "Feature": "seqtrans.model.extension",
    "ROW": "seqtrans.model.extension",
    "SENTENCE": "seqtrans.model.extension",
    "reorder_fields": "seqtrans.model.extension",
    "Constraint": "seqtrans.decoding.constraints",
    "ConstraintState": "seqtrans.decoding.constraints",
    "IncrementalConstraint": "seqtrans.decoding.constraints",
    # model formats of other toolkits (the seqtrans.formats group)
    "ModelFormat": "seqtrans.inference.formats",
    "write_run": "seqtrans.inference.formats",
    "TextCodec": "seqtrans.tasks.handover",
    # for a plugin's tests
    "check_task": "seqtrans.tasks.contract",
    "ContractError": "seqtrans.tasks.contract",
    "ContractWarning": "seqtrans.tasks.contract",
    "serve": "seqtrans.tasks.testing",
    "serve_directory": "seqtrans.tasks.testing",
    "without_download_settings": "seqtrans.tasks.testing",
}

__all__ = sorted(_API)

if TYPE_CHECKING:
    from seqtrans.config import (
        PRESETS,
        DecodeConfig,
        ModelConfig,
        RunConfig,
        TrainConfig,
        from_dict,
        merge,
        option,
        to_dict,
    )
    from seqtrans.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab, Vocabularies
    from seqtrans.decoding.constraints import Constraint, ConstraintState, IncrementalConstraint
    from seqtrans.errors import ConfigError, DataError, DownloadError, SeqtransError, UsageError
    from seqtrans.inference.formats import ModelFormat, write_run
    from seqtrans.model.extension import (
        ROW,
        SENTENCE,
        ExtensionError,
        Feature,
        ModelExtension,
        reorder_fields,
    )
    from seqtrans.runtime.atomic import new_directory, write_bytes
    from seqtrans.runtime.download import (
        CACHE_ENV,
        MIRROR_ENV,
        cache_dir,
        extract,
        fetch,
        file_name,
        sha256_file,
    )
    from seqtrans.tasks.abilities import ABILITIES, Ability
    from seqtrans.tasks.contract import ContractError, ContractWarning, check_task
    from seqtrans.tasks.handover import TextCodec
    from seqtrans.tasks.protocol import *  # noqa: F403 (its names: _protocol.__all__)
    from seqtrans.tasks.testing import serve, serve_directory, without_download_settings


def __dir__() -> list[str]:
    """The public names, loaded or not."""
    return list(__all__)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'seqtrans.plugin' has no attribute {name!r}")
