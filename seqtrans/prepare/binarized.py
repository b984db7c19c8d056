"""Binarized training pairs: every side's token ids in one memory-mapped file, with offsets.

A prepared dataset (:mod:`seqtrans.prepare` writes it) is a directory of:

``src.ids``, ``tgt.ids``
    A 64-byte header (magic, format, id type, number of ids, the dataset's key), then
    the ids of every sequence back to back. Sources end with EOS; targets have neither
    BOS nor EOS (as :class:`seqtrans.data.batches.Pairs` holds them).
``src.offsets.npy``, ``tgt.offsets.npy``
    int64, one more than the pairs: sequence ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
``src.lengths.npy``, ``tgt.lengths.npy``
    Every sequence's length (uint16, or int32 when one is longer than 65,535): token
    batches are built from these alone, so training touches the offsets and ids only
    of the sequences it reads.
``positions.npy``
    int64: pair ``i`` is the ``positions[i]``-th example the task read (0-based, left-out
    inputs not counted); resampling a source finds its example by it.
``vocab/``
    The task's vocabulary files.
``meta.json``
    Written last: the format, the key, counts, what was removed and why, and every
    file's size and sha256.

Opening checks sizes, headers and totals (cheap); :func:`open_dataset` with
``verify=True`` also checks every file's sha256 and every offset against its length.
Offsets and lengths are read into memory (10 to 12 bytes a sequence); a sequence's ids
are read with one positioned read through the page cache, which processes on one
machine share (:class:`MappedSequences`). Any mismatch is a
:class:`PreparedError` naming the file and the problem. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, overload

import numpy as np

from seqtrans.errors import DataError

MAGIC = b"SEQTIDS\0"
FORMAT = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sII Q 32s")  # magic, format, dtype code, count, key (raw sha256)
_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype("<u2"), 2: np.dtype("<i4")}
META = "meta.json"
SIDES = ("src", "tgt")


class PreparedError(DataError):
    """A prepared dataset's file is missing, truncated, damaged or from another dataset."""


def ids_dtype(vocab_size: int) -> np.dtype[Any]:
    """The narrowest id type for a vocabulary: 16 bits up to 65,536 symbols, else 32."""
    return _DTYPES[1] if vocab_size <= 1 << 16 else _DTYPES[2]


class IdsWriter:
    """Appends id arrays to ``path`` and writes its header on :meth:`close`; the sha256
    of the whole file is computed on the way."""

    def __init__(self, path: Path, *, dtype: np.dtype[Any], key: str) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.key = bytes.fromhex(key)
        self.count = 0
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._file.write(b"\0" * HEADER_BYTES)

    def append(self, ids: np.ndarray) -> None:
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        self._file.write(data)
        self.count += len(ids)

    def close(self) -> str:
        """Write the header, flush to disk; the file's sha256."""
        code = next(c for c, d in _DTYPES.items() if d == self.dtype)
        header = _HEADER.pack(MAGIC, FORMAT, code, self.count, self.key).ljust(HEADER_BYTES, b"\0")
        self._file.seek(0)
        self._file.write(header)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return sha256_of(self.path)  # the header comes last, so the file is hashed once it is whole


def read_ids(path: Path, *, key: str) -> np.memmap[Any, Any]:
    """The ids of a ``.ids`` file, memory-mapped read-only, after checking its header."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise PreparedError(path, None, "missing") from None
    if len(raw) < HEADER_BYTES:
        raise PreparedError(path, None, f"truncated: {len(raw)} bytes, shorter than its header")
    magic, fmt, code, count, file_key = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise PreparedError(path, None, "not a seqtrans ids file (wrong magic bytes)")
    if fmt != FORMAT or code not in _DTYPES:
        raise PreparedError(path, None, f"format {fmt} / id type {code}, expected format {FORMAT}")
    if file_key != bytes.fromhex(key):
        raise PreparedError(path, None, f"belongs to prepared data {file_key.hex()[:12]}, not {key[:12]}")
    dtype = _DTYPES[code]
    size = path.stat().st_size
    expected = HEADER_BYTES + count * dtype.itemsize
    if size != expected:
        raise PreparedError(path, None, f"truncated or extended: {size} bytes, its header says {expected}")
    if count == 0:
        return np.memmap(path, dtype=dtype, mode="r", offset=0, shape=(0,))  # nothing to map
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


class MappedSequences(Sequence[np.ndarray]):
    """Sequences of ids stored back to back in an ids file.

    ``self[i]`` reads sequence ``i`` with one positioned read (``pread``) through the
    page cache, which the processes of a machine share; ``ids`` maps the whole file for
    bulk access. Reading a batch through the mapping would map, by the kernel's
    fault-around, some 64 KB of the file around every sequence touched, so the pages a
    training process holds would grow with the file (docs/data.md, "Format"). The
    offsets are held in memory (8 bytes a sequence).
    """

    def __init__(self, ids: np.memmap[Any, Any], offsets: np.ndarray, lengths: np.ndarray) -> None:
        self.ids = ids
        self.offsets = offsets
        self.lengths = lengths  # every sequence's length
        self._path = str(ids.filename) if ids.filename else ""
        self._start = int(ids.offset)
        self._fd: tuple[int, int] | None = None  # (process id, descriptor): not inherited by a fork

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _descriptor(self) -> int:
        if self._fd is None or self._fd[0] != os.getpid():
            self._fd = (os.getpid(), os.open(self._path, os.O_RDONLY))
        return self._fd[1]

    def __del__(self) -> None:
        if self._fd is not None and self._fd[0] == os.getpid():
            os.close(self._fd[1])

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if not self._path or end == start:
            return np.asarray(self.ids[start:end])
        size = self.ids.dtype.itemsize
        data = os.pread(self._descriptor(), (end - start) * size, self._start + start * size)
        if len(data) != (end - start) * size:
            raise PreparedError(self._path, None, "shorter than when it was opened (changed on disk?)")
        return np.frombuffer(data, dtype=self.ids.dtype)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]


@dataclass
class Dataset:
    """An opened prepared dataset."""

    directory: Path
    meta: dict[str, Any]
    src: MappedSequences
    tgt: MappedSequences
    positions: np.ndarray

    def __len__(self) -> int:
        return len(self.src)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _load_array(path: Path, *, length: int, dtypes: tuple[str, ...] = ("<i8",)) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise PreparedError(path, None, "missing") from None
    except (ValueError, OSError, EOFError) as exc:
        raise PreparedError(path, None, f"not a readable array file: {exc}") from None
    if array.dtype.str not in dtypes or array.shape != (length,):
        raise PreparedError(path, None, f"holds {array.dtype} {array.shape}, expected "
                                        f"{' or '.join(dtypes)} ({length},)")
    return array


def open_dataset(directory: Path, *, key: str, verify: bool = False) -> Dataset:
    """Open a prepared dataset written under ``key``; with ``verify``, check every
    file's sha256 as well."""
    meta_path = directory / META
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PreparedError(meta_path, None, "missing (the preparation did not finish)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PreparedError(meta_path, None, f"not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("key") != key:
        raise PreparedError(meta_path, None, f"describes another dataset or format (expected format "
                                             f"{FORMAT}, key {key[:12]})")
    n = meta.get("pairs")
    if not isinstance(n, int) or n < 0:
        raise PreparedError(meta_path, None, f"'pairs' is {n!r}, not a count")
    sides = []
    for side in SIDES:
        ids = read_ids(directory / f"{side}.ids", key=key)
        offsets_path = directory / f"{side}.offsets.npy"
        offsets = np.array(_load_array(offsets_path, length=n + 1))  # in memory: read per batch
        lengths_path = directory / f"{side}.lengths.npy"
        lengths = np.array(_load_array(lengths_path, length=n, dtypes=("<u2", "<i4")))  # read whole: small
        if offsets[0] != 0 or offsets[-1] != len(ids):
            raise PreparedError(offsets_path, None, "offsets do not span its ids file")
        if int(lengths.sum(dtype=np.int64)) != len(ids) or (n and lengths.min() < 1):
            raise PreparedError(lengths_path, None, "lengths do not add up to its ids file")
        if verify and not np.array_equal(np.diff(offsets), lengths):
            raise PreparedError(offsets_path, None, "offsets disagree with the lengths")
        sides.append(MappedSequences(ids, offsets, lengths))
    positions = _load_array(directory / "positions.npy", length=n)
    files = meta.get("files", {})
    for name, info in files.items():
        path = directory / name
        if not path.is_file():
            raise PreparedError(path, None, "missing")
        if path.stat().st_size != info["bytes"]:
            raise PreparedError(path, None, f"{path.stat().st_size} bytes, {info['bytes']} when written")
        if verify and sha256_of(path) != info["sha256"]:
            raise PreparedError(path, None, "its sha256 differs from the one recorded when it was written")
    return Dataset(directory, meta, sides[0], sides[1], positions)


def lengths_dtype(longest: int) -> np.dtype[Any]:
    return np.dtype("<u2") if longest <= 0xFFFF else np.dtype("<i4")


def save_array(path: Path, array: np.ndarray) -> str:
    """Write a ``.npy`` file and flush it to disk; its sha256."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return sha256_of(path)
