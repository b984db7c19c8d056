"""Preparing training data once: read as a stream, encoded by worker processes, binarized.

:func:`prepare` turns a task's training split into a prepared dataset
(:mod:`seqtrans.prepare.binarized`) in a cache, keyed by the sha256 of the data (the task's
:class:`~seqtrans.tasks.DataDigest`, or what its reader yields), the settings that
shape the pairs, and the vocabulary when a run brings its own. It

1. builds the vocabulary from the training examples, streamed (the task samples what it
   needs for its vocabulary, a bounded sample for example);
2. reads the examples again as a stream and sends chunks of them to worker processes,
   which encode them through the codec (it pickles) and write one shard file each;
3. joins the shards into one ids file per side with offsets and the examples'
   positions, removes duplicate pairs when asked, and writes ``meta.json`` last.

Everything is written under ``KEY.partial/`` and renamed into place when whole; a
shard is written to a temporary name and renamed, so an interrupted preparation is
resumed from its finished shards (the data are read again, but not encoded again).
A lock file keeps two processes from preparing the same data at once. Pairs are left
out, and counted by reason, when the task skips them, when a side is longer than
``train.max_length`` and, with ``train.dedup``, when they repeat an earlier pair.

One module a job: :mod:`.cache` (keys, directories, the lock), :mod:`.vocabulary`,
:mod:`.workers` (the worker pool encoding shards) and :mod:`.join` (joining and
deduplicating the shards). None imports torch: workers start quickly and small.
"""


from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans.config import RunConfig
from seqtrans.data.assets import read_assets
from seqtrans.prepare.binarized import Dataset, PreparedError, open_dataset
from seqtrans.prepare.cache import cache_root, data_digest, dataset_directory, dataset_key, reuse_or_build
from seqtrans.prepare.join import join
from seqtrans.prepare.vocabulary import COUNT, VOCAB, build_codec
from seqtrans.prepare.vocabulary import examples_of as examples_of  # what the pipeline reads through
from seqtrans.prepare.workers import encode_examples
from seqtrans.tasks import handover
from seqtrans.tasks.protocol import Codec, Task, bind_languages

__all__ = ["Prepared", "examples_of", "prepare"]

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A prepared dataset, opened, with the codec of its vocabulary."""

    dataset: Dataset
    codec: Codec[Any, Any, Any]
    assets: dict[str, bytes]  # the vocabulary files, stored in checkpoints
    reused: bool  # found in the cache: nothing was prepared

    @property
    def directory(self) -> Path:
        return self.dataset.directory


def prepare(task: Task[Any, Any, Any], config: RunConfig, *, vocabulary: Mapping[str, bytes] | None = None,
            progress: bool = False, verify: bool = False) -> Prepared:
    """The prepared training data of ``task`` under ``config``: from the cache, or made.

    ``vocabulary`` (a run's vocabulary files) is used as it is instead of building one;
    when the dataset prepared with a built vocabulary has the same files, that one is
    used. ``verify`` checks every file's sha256 when the data is found in the cache; a
    cached dataset that fails a check is reported and prepared again.
    """
    data = data_digest(task, config)
    root = cache_root(config)
    key = dataset_key(config, data, None)
    if vocabulary:
        own = dataset_directory(root, config, key) / VOCAB  # the vocabulary that preparation built
        if not (own.is_dir() and read_assets(own) == dict(vocabulary)):
            key = dataset_key(config, data, vocabulary)

    def reuse(directory: Path, built: bool) -> Prepared:
        prepared = _open(task, directory, key, verify=verify and not built, config=config)
        prepared.reused = not built
        if not built:
            log.info("prepared data: reusing %s (%d pairs)", directory, len(prepared.dataset))
        return prepared

    return reuse_or_build(dataset_directory(root, config, key), reuse=reuse,
                          build=lambda partial: _build(task, config, key, partial, vocabulary=vocabulary,
                                                       progress=progress))


def _bound(codec: Codec[Any, Any, Any], config: RunConfig) -> Codec[Any, Any, Any]:
    """The codec of a model of several languages bound to the run's (``decode.source_lang``
    and ``decode.target_lang``), which its training pairs are encoded with."""
    return bind_languages(codec, source=config.decode.source_lang, target=config.decode.target_lang)


def _open(task: Task[Any, Any, Any], directory: Path, key: str, *, verify: bool,
          config: RunConfig) -> Prepared:
    dataset = open_dataset(directory, key=key, verify=verify)
    vocab_dir = directory / VOCAB
    if not vocab_dir.is_dir():
        raise PreparedError(vocab_dir, None, "missing")
    codec = _bound(handover.load_codec(task, vocab_dir), config)
    return Prepared(dataset, codec, read_assets(vocab_dir), reused=True)


def _build(task: Task[Any, Any, Any], config: RunConfig, key: str, partial: Path, *,
           vocabulary: Mapping[str, bytes] | None, progress: bool) -> None:
    partial.mkdir(exist_ok=True)
    codec = _bound(build_codec(task, partial, vocabulary, progress=progress), config)
    count_path = partial / COUNT
    total = json.loads(count_path.read_text())["examples"] if count_path.is_file() else None
    shards = partial / "shards"
    shards.mkdir(exist_ok=True)
    removed, examples, count = encode_examples(task, codec, config, shards, total=total, progress=progress)
    join(codec, config, key, partial, shards, removed, examples, expected=count)
