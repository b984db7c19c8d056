"""Where a prepared dataset lies and when it may be reused: its cache key (the digest of
the data, the settings that shape the pairs, and a given vocabulary), its directory, and
the lock under which one process reuses or builds it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from seqtrans.config import RunConfig, to_dict
from seqtrans.data.assets import assets_digest
from seqtrans.prepare.binarized import FORMAT, PreparedError
from seqtrans.runtime import download
from seqtrans.runtime.system import file_lock
from seqtrans.tasks.protocol import CacheDirectory, DataDigest, Task

log = logging.getLogger(__name__)

T = TypeVar("T")


def cache_root(config: RunConfig) -> Path:
    """The directory of prepared datasets: ``prepared/`` under the task's ``data.cache_dir``
    (:class:`~seqtrans.tasks.protocol.CacheDirectory`), else under the default cache
    (:func:`seqtrans.runtime.download.cache_dir`). ``train.data_cache``, deprecated, still
    names the directory itself when set: runs that set it find their data where it was."""
    if config.train.data_cache:
        log.warning("train.data_cache is deprecated: set data.cache_dir, which moves the downloads and "
                    "the prepared data (into its prepared/) together, or $SEQTRANS_CACHE_DIR; prepared data "
                    "is kept in %s as it says", config.train.data_cache)
        return Path(config.train.data_cache).expanduser()
    return download.cache_dir(own_cache(config.data)) / "prepared"


def own_cache(data: object) -> str | None:
    """The cache directory a task's data settings name (``data.cache_dir``), or None."""
    return (data.cache_dir or None) if isinstance(data, CacheDirectory) else None


def data_digest(task: Task[Any, Any, Any], config: RunConfig) -> str:
    """The task's digest of its training data; without one, the sha256 of the data
    settings and of everything its training reader yields (read once for this)."""
    if isinstance(task, DataDigest):
        return f"task:{task.train_digest()}"
    settings = to_dict(config.data)
    if isinstance(config.data, CacheDirectory):
        settings.pop("cache_dir", None)  # where the data is kept, not what it is
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for item in task.read("train"):
        data = pickle.dumps(item, protocol=4)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return f"read:{digest.hexdigest()}"


def dataset_key(config: RunConfig, data: str, vocabulary: Mapping[str, bytes] | None) -> str:
    """The cache key of a prepared dataset: sha256 of the data's digest (:func:`data_digest`),
    the settings that shape the pairs, and the vocabulary when it is given rather than built."""
    parts = {
        "format": FORMAT,
        "task": config.task,
        "data": data,
        "max_length": config.train.max_length,
        "dedup": config.train.dedup,
        "vocabulary": assets_digest(vocabulary) if vocabulary else "built",
    }
    languages = (config.decode.source_lang, config.decode.target_lang)
    if any(languages):  # a model of several languages encodes its pairs with their codes
        parts["languages"] = list(languages)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def dataset_directory(root: Path, config: RunConfig, key: str) -> Path:
    return root / f"{config.task}-{key[:20]}"


def reuse_or_build(final: Path, *, reuse: Callable[[Path, bool], T], build: Callable[[Path], None]) -> T:
    """What ``reuse(final, built)`` opens at ``final``: found there (``built`` False), or
    built by ``build`` into ``final.partial`` first and renamed (``built`` True), under a
    lock file that keeps two processes from preparing the same data at once. A found copy
    that ``reuse`` refuses (a :class:`~seqtrans.prepare.binarized.PreparedError`) is reported and
    built again."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.with_name(final.name + ".lock")):
        if final.exists():
            try:
                return reuse(final, False)
            except PreparedError as exc:
                log.warning("prepared data: %s; preparing it again", exc)
                shutil.rmtree(final)
        started = time.perf_counter()
        partial = final.with_name(final.name + ".partial")
        build(partial)
        os.replace(partial, final)
        log.info("prepared data: %s in %.1f s", final, time.perf_counter() - started)
        return reuse(final, True)
