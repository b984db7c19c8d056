"""Encoding a task's training examples into shard files, in a pool of worker processes.

The examples are read as a stream and sent in chunks of :data:`CHUNK`; each chunk is
encoded through the codec (it pickles) into one shard file, written to a temporary name
and renamed, so an interrupted preparation resumes from its finished shards. Workers
are spawned, and this module imports no torch: they start quickly and small.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import pickle
import time
from array import array
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from seqtrans.config import RunConfig
from seqtrans.data.encoding import source_ids, target_ids, within
from seqtrans.errors import DataError
from seqtrans.runtime import atomic
from seqtrans.tasks.protocol import Codec, Example, Skipped, Task

log = logging.getLogger(__name__)

CHUNK = 10_000  # examples per shard: small enough to bound memory, large enough to amortize a task


@dataclass
class Removed:
    """What was left out, by reason, with the first origin of each task-given reason."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def skip(self, item: Skipped) -> None:
        self.counts[item.reason] += 1
        self.first.setdefault(item.reason, item.origin)


def encode_examples(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any], config: RunConfig,
                    shards: Path, *, total: int | None, progress: bool) -> tuple[Removed, int, int]:
    """Encode the examples into shard files (skipping shards already written); what the
    task left out, the number of examples read and the number of shards they fill."""
    removed = Removed()
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
            index += 1
        encoder.finish()
    for reason, count in removed.counts.items():  # the task's own choice: news, not a problem
        log.info("train: left out %d of %d inputs: %s (first: %s)", count,
                 read + sum(removed.counts.values()), reason, removed.first[reason])
    return removed, read, index


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
        if shard_path(self.shards, index).is_file():
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


def shard_path(shards: Path, index: int) -> Path:
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
    path = shard_path(shards, index)
    with atomic.replacing(path) as f:
        np.savez(f, src=np.frombuffer(src, np.int32), tgt=np.frombuffer(tgt, np.int32),
                 src_len=np.frombuffer(src_len, np.int32), tgt_len=np.frombuffer(tgt_len, np.int32),
                 positions=np.frombuffer(positions, np.int64), hashes=np.frombuffer(hashes, np.uint64),
                 too_long=np.array(too_long))
