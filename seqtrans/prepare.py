"""Preparing training data once: read as a stream, encoded by worker processes, binarized.

:func:`prepare` turns a task's training split into a prepared dataset
(:mod:`seqtrans.binarized`) in a cache, keyed by the sha256 of the data (the task's
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

This module imports no torch: workers start quickly and small.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from seqtrans import atomic, download
from seqtrans.assets import assets_digest, read_assets
from seqtrans.binarized import (
    FORMAT,
    META,
    SIDES,
    Dataset,
    IdsWriter,
    PreparedError,
    ids_dtype,
    lengths_dtype,
    open_dataset,
    save_array,
)
from seqtrans.config import RunConfig, to_dict
from seqtrans.encoding import source_ids, target_ids, within
from seqtrans.errors import DataError
from seqtrans.system import file_lock, release_freed_memory
from seqtrans.tasks.protocol import Codec, DataDigest, Example, Skipped, Task

log = logging.getLogger(__name__)

CHUNK = 10_000  # examples per shard: small enough to bound memory, large enough to amortize a task
VOCAB = "vocab"
_COUNT = "count.json"


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


@dataclass
class _Removed:
    """What was left out, by reason, with the first origin of each task-given reason."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def skip(self, item: Skipped) -> None:
        self.counts[item.reason] += 1
        self.first.setdefault(item.reason, item.origin)


def cache_root(config: RunConfig) -> Path:
    """The directory of prepared datasets (``train.data_cache``)."""
    if config.train.data_cache:
        return Path(config.train.data_cache).expanduser()
    return download.cache_dir() / "prepared"


def data_digest(task: Task[Any, Any, Any], config: RunConfig) -> str:
    """The task's digest of its training data; without one, the sha256 of the data
    settings and of everything its training reader yields (read once for this)."""
    if isinstance(task, DataDigest):
        return f"task:{task.train_digest()}"
    digest = hashlib.sha256(json.dumps(to_dict(config.data), sort_keys=True).encode())
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
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


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
        built = _directory(root, config, key) / VOCAB
        if not (built.is_dir() and read_assets(built) == dict(vocabulary)):
            key = dataset_key(config, data, vocabulary)
    final = _directory(root, config, key)
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(final.with_name(final.name + ".lock")):
        if final.exists():
            try:
                found = _open(task, final, key, verify=verify)
                log.info("prepared data: reusing %s (%d pairs)", final, len(found.dataset))
                return found
            except PreparedError as exc:
                log.warning("prepared data: %s; preparing it again", exc)
                shutil.rmtree(final)
        started = time.perf_counter()
        partial = final.with_name(final.name + ".partial")
        _build(task, config, key, partial, vocabulary=vocabulary, progress=progress)
        os.replace(partial, final)
        prepared = _open(task, final, key, verify=False)
        prepared.reused = False
        log.info("prepared data: %s in %.1f s", final, time.perf_counter() - started)
        return prepared


def _directory(root: Path, config: RunConfig, key: str) -> Path:
    return root / f"{config.task}-{key[:20]}"


def _open(task: Task[Any, Any, Any], directory: Path, key: str, *, verify: bool) -> Prepared:
    dataset = open_dataset(directory, key=key, verify=verify)
    vocab_dir = directory / VOCAB
    if not vocab_dir.is_dir():
        raise PreparedError(vocab_dir, None, "missing")
    return Prepared(dataset, task.load_vocabulary(vocab_dir), read_assets(vocab_dir), reused=True)


def examples_of(items: Iterable[Example[Any, Any] | Skipped]) -> Iterator[Example[Any, Any]]:
    """The examples of what :meth:`Task.read` yields, without the :class:`Skipped` records."""
    return (item for item in items if not isinstance(item, Skipped))


# ----------------------------------------------------------------------------- building


def _build(task: Task[Any, Any, Any], config: RunConfig, key: str, partial: Path, *,
           vocabulary: Mapping[str, bytes] | None, progress: bool) -> None:
    partial.mkdir(exist_ok=True)
    codec = _vocabulary(task, partial, vocabulary, progress=progress)
    count_path = partial / _COUNT
    total = json.loads(count_path.read_text())["examples"] if count_path.is_file() else None
    shards = partial / "shards"
    shards.mkdir(exist_ok=True)
    removed, examples = _encode(task, codec, config, shards, total=total, progress=progress)
    _join(codec, config, key, partial, shards, removed, examples)


def _vocabulary(task: Task[Any, Any, Any], partial: Path, given: Mapping[str, bytes] | None, *,
                progress: bool) -> Codec[Any, Any, Any]:
    """The codec: from the vocabulary given, or one an interrupted preparation built, or
    built now from the streamed examples (counted on the way, for the progress bar)."""
    directory = partial / VOCAB
    if not directory.is_dir():
        scratch = Path(tempfile.mkdtemp(prefix="vocab-", dir=partial))
        try:
            if given:
                for name, data in given.items():
                    (scratch / name).write_bytes(data)
            else:
                counted = 0
                with tqdm(desc="vocabulary: reading", unit=" examples", unit_scale=True,
                          disable=not progress, leave=False) as bar:
                    def examples() -> Iterator[Example[Any, Any]]:
                        nonlocal counted
                        for ex in examples_of(task.read("train")):
                            counted += 1
                            bar.update(1)
                            yield ex

                    task.build_vocabulary(scratch, examples())
                (partial / _COUNT).write_text(json.dumps({"examples": counted}))
            os.replace(scratch, directory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        release_freed_memory()  # a vocabulary trainer's; this process lives on through training
    return task.load_vocabulary(directory)


def _encode(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any], config: RunConfig, shards: Path, *,
            total: int | None, progress: bool) -> tuple[_Removed, int]:
    """Encode the examples into shard files (skipping shards already written); what the
    task left out, and the number of examples read."""
    removed = _Removed()
    workers = config.train.prepare_workers or os.cpu_count() or 1
    encoder = _Encoder(codec, shards, config.train.max_length, workers)
    chunk: list[Example[Any, Any]] = []
    index = read = 0
    started = reported = time.monotonic()
    with tqdm(total=total, desc="prepare: encoding", unit=" examples", unit_scale=True,
              disable=not progress, smoothing=0.1) as bar, encoder:
        for item in task.read("train"):
            if isinstance(item, Skipped):
                removed.skip(item)
                continue
            chunk.append(item)
            read += 1
            if len(chunk) == CHUNK:
                encoder.submit(index, read - len(chunk), chunk)
                bar.update(len(chunk))
                index, chunk = index + 1, []
                if not progress and time.monotonic() - reported > 60:  # a log line where no bar shows
                    reported = time.monotonic()
                    log.info("prepare: %d examples read, %.0f a second%s", read,
                             read / (reported - started),
                             f", about {(total - read) * (reported - started) / read:.0f} s left"
                             if total else "")
        if chunk:
            encoder.submit(index, read - len(chunk), chunk)
            bar.update(len(chunk))
        encoder.finish()
    for reason, count in removed.counts.items():  # the task's own choice: news, not a problem
        log.info("train: left out %d of %d inputs: %s (first: %s)", count,
                 read + sum(removed.counts.values()), reason, removed.first[reason])
    return removed, read


class _Encoder:
    """Encodes chunks into shards: in this process while there is one chunk, then in a
    pool of worker processes, with at most two chunks a worker in flight."""

    def __init__(self, codec: Codec[Any, Any, Any], shards: Path, max_length: int, workers: int) -> None:
        self.codec, self.shards, self.max_length, self.workers = codec, shards, max_length, workers
        self.pool: ProcessPoolExecutor | None = None
        self.held: tuple[int, int, list[Example[Any, Any]]] | None = None
        self.pending: deque[Future[None]] = deque()

    def __enter__(self) -> _Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            # after a failure, the chunks not yet started are dropped
            self.pool.shutdown(wait=True, cancel_futures=exc[0] is not None)

    def submit(self, index: int, first: int, examples: list[Example[Any, Any]]) -> None:
        if _shard_path(self.shards, index).is_file():
            return  # written before an interruption
        if self.workers <= 1:
            encode_shard(self.codec, index, first, examples, self.shards, self.max_length)
            return
        if self.pool is None and self.held is None:
            self.held = (index, first, examples)  # a single chunk is not worth starting workers
            return
        if self.pool is None:
            # spawn, not fork: this process may hold threads; an executor, not a Pool: a worker
            # that dies ends the preparation with an error instead of a wait for ever
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker, initargs=(pickle.dumps(self.codec),))
            assert self.held is not None
            self._send(*self.held)
            self.held = None
        self._send(index, first, examples)

    def _send(self, index: int, first: int, examples: list[Example[Any, Any]]) -> None:
        assert self.pool is not None
        while len(self.pending) >= 2 * self.workers:
            self._wait(self.pending.popleft())
        self.pending.append(self.pool.submit(
            _encode_in_worker, (index, first, examples, str(self.shards), self.max_length)))

    @staticmethod
    def _wait(future: Future[None]) -> None:
        try:
            future.result()
        except BrokenProcessPool as exc:
            raise DataError(None, None, f"an encoding worker process died ({exc}); nothing it "
                                        "had not finished was kept, and preparing again resumes") from None

    def finish(self) -> None:
        if self.held is not None:
            encode_shard(self.codec, *self.held, self.shards, self.max_length)
            self.held = None
        while self.pending:
            self._wait(self.pending.popleft())


_WORKER_CODEC: Codec[Any, Any, Any] | None = None


def _init_worker(codec: bytes) -> None:
    global _WORKER_CODEC
    _WORKER_CODEC = pickle.loads(codec)


def _encode_in_worker(job: tuple[int, int, list[Example[Any, Any]], str, int]) -> None:
    index, first, examples, shards, max_length = job
    assert _WORKER_CODEC is not None
    encode_shard(_WORKER_CODEC, index, first, examples, Path(shards), max_length)


def _shard_path(shards: Path, index: int) -> Path:
    return shards / f"shard-{index:07d}.npz"


def encode_shard(codec: Codec[Any, Any, Any], index: int, first: int, examples: list[Example[Any, Any]],
                 shards: Path, max_length: int) -> None:
    """Encode ``examples`` (the task's examples ``first``, ``first + 1``, ...) into shard
    ``index``: ids and lengths of both sides, positions, pair hashes, the count of pairs
    too long for ``max_length``. Written to a temporary name, then renamed."""
    src, tgt = array("i"), array("i")
    src_len, tgt_len, positions, hashes = array("i"), array("i"), array("q"), array("Q")
    too_long = 0
    for offset, ex in enumerate(examples):
        try:
            s, t = source_ids(codec, ex.source), target_ids(codec, ex.target)
        except DataError:
            raise  # names its file and line already
        except Exception as exc:  # a codec's failure on one example names the example
            raise DataError(ex.origin or None, None, f"cannot encode: {type(exc).__name__}: {exc}") from None
        if not within(max_length, s, t):
            too_long += 1
            continue
        pair = array("i", s)
        pair.append(-1)  # a separator no id takes
        pair.extend(t)
        hashes.append(int.from_bytes(hashlib.blake2b(pair.tobytes(), digest_size=8).digest(), "little"))
        src.extend(s)
        tgt.extend(t)
        src_len.append(len(s))
        tgt_len.append(len(t))
        positions.append(first + offset)
    path = _shard_path(shards, index)
    with atomic.replacing(path) as f:
        np.savez(f, src=np.frombuffer(src, np.int32), tgt=np.frombuffer(tgt, np.int32),
                 src_len=np.frombuffer(src_len, np.int32), tgt_len=np.frombuffer(tgt_len, np.int32),
                 positions=np.frombuffer(positions, np.int64), hashes=np.frombuffer(hashes, np.uint64),
                 too_long=np.array(too_long))


def _join(codec: Codec[Any, Any, Any], config: RunConfig, key: str, partial: Path, shards: Path,
          removed: _Removed, examples: int) -> None:
    """Join the shards into the dataset's files; ``meta.json`` last."""
    paths = sorted(shards.glob("shard-*.npz"))
    expected = -(-examples // CHUNK)
    if len(paths) != expected:
        raise PreparedError(shards, None, f"{len(paths)} shards for {examples} examples, expected {expected}")
    inputs = examples + sum(removed.counts.values())  # before the engine's own removals
    keep = _kept(paths, dedup=config.train.dedup, removed=removed)
    vocabs = codec.vocabularies
    dtype = ids_dtype(max(len(vocabs.source), len(vocabs.target)))
    writers = {side: IdsWriter(partial / f"{side}.ids", dtype=dtype, key=key) for side in SIDES}
    too_long, lengths, positions = _copy_shards(paths, keep, writers)
    if too_long:
        removed.counts[f"longer than train.max_length={config.train.max_length} tokens"] = too_long
    for reason, count in removed.counts.items():
        if reason not in removed.first:  # the engine's own removals; the task's were logged as read
            log.warning("train: removed %d of %d pairs: %s", count, examples, reason)
    files: dict[str, dict[str, Any]] = {}
    tokens = {}
    for side in SIDES:
        files[f"{side}.ids"] = {"sha256": writers[side].close()}
        tokens[side] = _write_lengths(partial, side, lengths[side], files)
    pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    files["positions.npy"] = {"sha256": save_array(partial / "positions.npy", pos.astype(np.int64))}
    for name, info in files.items():
        info["bytes"] = (partial / name).stat().st_size
    shutil.rmtree(shards)
    (partial / _COUNT).unlink(missing_ok=True)
    if not len(pos):
        raise DataError(None, None, f"no training pairs are left after preparation (removed: "
                                    f"{dict(removed.counts) or 'none'})")
    meta = {
        "format": FORMAT, "key": key, "task": config.task, "pairs": len(pos), "inputs_read": inputs,
        "tokens": {"source": tokens["src"], "target": tokens["tgt"]},
        "removed": dict(sorted(removed.counts.items())), "ids_dtype": dtype.str,
        "vocabulary": {"source": len(vocabs.source), "target": len(vocabs.target), "shared": vocabs.shared},
        "settings": {"max_length": config.train.max_length, "dedup": config.train.dedup},
        "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic.write_json(partial / META, meta)
    log.info("prepared data: %d pairs (%d source / %d target tokens) of %d inputs read; removed: %s",
             len(pos), tokens["src"], tokens["tgt"], inputs,
             ", ".join(f"{n} {reason}" for reason, n in sorted(removed.counts.items())) or "none")


def _kept(paths: list[Path], *, dedup: bool, removed: _Removed) -> np.ndarray:
    """Which pairs of the shards are kept, in order [P] bool: all, or with ``dedup`` the
    first of each pair hash (the repeats counted in ``removed``)."""
    hashes = np.concatenate([np.load(p)["hashes"] for p in paths]) if paths else np.zeros(0, np.uint64)
    keep = np.ones(len(hashes), dtype=bool)
    if dedup and len(hashes):
        _, first = np.unique(hashes, return_index=True)
        keep[:] = False
        keep[first] = True
        removed.counts["duplicate of an earlier pair (train.dedup)"] = int((~keep).sum())
    return keep


def _copy_shards(paths: list[Path], keep: np.ndarray, writers: Mapping[str, IdsWriter],
                 ) -> tuple[int, dict[str, list[np.ndarray]], list[np.ndarray]]:
    """Append the kept pairs' ids of every shard to ``writers``; the count of pairs too long
    for ``train.max_length``, the kept lengths of each side and the kept positions, per shard."""
    too_long = 0
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    positions: list[np.ndarray] = []
    start = 0
    for path in paths:
        shard = np.load(path)
        too_long += int(shard["too_long"])
        mask = keep[start: start + len(shard["hashes"])]
        start += len(mask)
        for side in SIDES:
            ids, lens = shard[side], shard[f"{side}_len"]
            if not mask.all():
                ends = np.cumsum(lens)
                ids = np.concatenate([ids[a:b] for a, b, k in zip(ends - lens, ends, mask) if k] or [ids[:0]])
                lens = lens[mask]
            writers[side].append(ids)
            lengths[side].append(lens)
        positions.append(shard["positions"][mask])
    return too_long, lengths, positions


def _write_lengths(partial: Path, side: str, lengths: list[np.ndarray],
                   files: dict[str, dict[str, Any]]) -> int:
    """Write a side's offsets and lengths (recorded in ``files``); its number of tokens."""
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    files[f"{side}.offsets.npy"] = {"sha256": save_array(partial / f"{side}.offsets.npy", offsets)}
    narrow = lens.astype(lengths_dtype(int(lens.max(initial=0))))
    files[f"{side}.lengths.npy"] = {"sha256": save_array(partial / f"{side}.lengths.npy", narrow)}
    return int(offsets[-1])
