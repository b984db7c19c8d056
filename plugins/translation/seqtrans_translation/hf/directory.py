"""A local Hugging Face model directory as the importer reads it: ``config.json``,
``generation_config.json`` where there is one, the weights (``model.safetensors``, or
the shards that ``model.safetensors.index.json`` lists) and the tokenizer files.

Every problem is a :class:`~seqtrans.plugin.DataError` naming the file (and the field or
tensor): the import writes nothing then. A pickled ``pytorch_model.bin`` is read only
when the caller allows it, since unpickling a file can run any code it holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seqtrans.plugin import DataError
from seqtrans_translation.hf_marian.tensors import Stored, pickle_refused, read_stored, safetensors_index

#: One seqtrans tensor and the model's tensors it is made of, concatenated along the
#: first dimension (self-attention's fused query, key and value), each with its shape.
#: Each family's ``key_map`` lists them; import and export read the same list.
Entry = tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = "pytorch_model.bin"
#: How much of a table :meth:`Weights.rows` reads at once.
_BLOCK_BYTES = 16 << 20


def read_json(path: Path, *, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; ``what`` says what the file is for when it is missing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(path, None, f"missing: {what}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, None, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(path, None, "not a JSON object")
    return data


@dataclass(frozen=True)
class Settings:
    """``config.json``'s fields, each read with its type checked and the file named."""

    values: Mapping[str, Any]
    path: Path

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.values.get(key, default)
        if value is None and default is None:
            raise DataError(self.path, None, f"field '{key}' is missing")
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise DataError(self.path, None, f"field '{key}': expected {kind.__name__}, got {value!r}")
        return value

    def optional(self, key: str, kind: type) -> Any:
        """The field's value, or None where it is absent or null."""
        return None if self.values.get(key) is None else self.get(key, kind)

    def fail(self, key: str, reason: str) -> DataError:
        return DataError(self.path, None, f"field '{key}' is {self.values.get(key)!r}: {reason}")


class _Safetensors(Mapping[str, Tensor]):
    """A safetensors file's tensors by name, each read from the file when it is asked for,
    into memory of its own: the importer keeps one tensor at a time beside what it has
    converted, never a second copy of the whole model (a map of the file would keep every
    page it read resident until the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index = safetensors_index(path)

    def __getitem__(self, name: str) -> Tensor:
        with self.path.open("rb") as f:
            return read_stored(f, self.index[name])

    def __contains__(self, name: object) -> bool:  # Mapping's own would read the tensor
        return name in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


@dataclass
class Weights:
    """The model's tensors by name, read one at a time from their files, and which were
    taken: a tensor the importer did not use is named in a warning."""

    files: dict[str, Path]  # tensor name -> the file that holds it
    _open: dict[Path, Mapping[str, Tensor]] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def names(self) -> Iterator[str]:
        return iter(self.files)

    def take(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """Tensor ``name`` as float32, checked against the shape config.json implies."""
        path = self.files.get(name)
        if path is None:
            raise DataError(self._first(), None, f"tensor '{name}' is missing")
        tensor = self._opened(path)[name]
        if tuple(tensor.shape) != shape:
            raise DataError(path, None, f"tensor '{name}' has shape {tuple(tensor.shape)}, but "
                                        f"config.json implies {shape}")
        self.taken.add(name)
        return tensor.float()

    def joined(self, parts: tuple[tuple[str, tuple[int, ...]], ...]) -> Tensor:
        """The tensors of an :data:`Entry`, concatenated along the first dimension (a single
        tensor as it was read: no copy)."""
        if len(parts) == 1:
            return self.take(*parts[0])
        return torch.cat([self.take(name, shape) for name, shape in parts])

    def first_of(self, names: tuple[str, ...], shape: tuple[int, ...]) -> Tensor:
        """The first of ``names`` the files hold (tied tensors are saved under one name)."""
        return self.take(self._held(names), shape)

    def rows(self, names: tuple[str, ...], shape: tuple[int, ...], order: Tensor) -> Tensor:
        """The rows ``order`` [R] (in that order) of the first of ``names`` the files hold,
        as float32: from a safetensors file, read a block of rows at a time, so that the
        table (an embedding matrix, 1 GB for NLLB-200's) is never in memory twice.
        [V, ...] -> [R, ...]"""
        name = self._held(names)
        path = self.files[name]
        source = self._opened(path)
        if not isinstance(source, _Safetensors):
            return self.take(name, shape).index_select(0, order)
        stored = source.index[name]
        if stored.shape != shape:
            raise DataError(path, None, f"tensor '{name}' has shape {stored.shape}, but "
                                        f"config.json implies {shape}")
        self.taken.add(name)
        out = torch.empty((order.numel(), *shape[1:]))
        row_bytes = stored.nbytes // max(shape[0], 1)
        block = max(1, _BLOCK_BYTES // max(row_bytes, 1))
        with path.open("rb") as f:
            for first in range(0, shape[0], block):
                count = min(block, shape[0] - first)
                rows = Stored(stored.dtype, (count, *shape[1:]), stored.offset + first * row_bytes,
                              count * row_bytes)  # rows first .. first + count - 1
                part = read_stored(f, rows)
                where = ((order >= first) & (order < first + count)).nonzero().squeeze(1)  # [R']
                out[where] = part.float().index_select(0, order[where] - first)
        return out

    def _held(self, names: tuple[str, ...]) -> str:
        for name in names:
            if name in self.files:
                return name
        raise DataError(self._first(), None, f"none of the tensors {', '.join(names)} is there")

    def _opened(self, path: Path) -> Mapping[str, Tensor]:
        if path not in self._open:
            self._open[path] = _read(path)
        return self._open[path]

    def _first(self) -> Path:
        return next(iter(self.files.values()))


def _read(path: Path) -> Mapping[str, Tensor]:
    if path.name.endswith(".safetensors"):
        return _Safetensors(path)
    try:
        # a map of the file: its tensors are read as they are used
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged or hostile file
        raise DataError(path, None,
                        f"not a plain weight file ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(loaded, Mapping) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise DataError(path, None, "does not hold a mapping of tensor names to tensors")
    return dict(loaded)


def _whole(path: Path) -> Weights:
    """The tensors of one weight file."""
    tensors = _read(path)
    return Weights(dict.fromkeys(tensors, path), {path: tensors})


def weights(directory: Path, *, allow_pickle: bool = False) -> Weights:
    """The weight files of ``directory``: one safetensors file, the shards an index lists,
    or (with ``allow_pickle``) a pickled ``pytorch_model.bin``."""
    if (directory / SAFETENSORS).is_file():
        return _whole(directory / SAFETENSORS)
    if (directory / INDEX).is_file():
        index = read_json(directory / INDEX, what="the index of the weight shards")
        mapping = index.get("weight_map")
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise DataError(directory / INDEX, None,
                            "field 'weight_map' is not a map of tensor names to files")
        files, opened = {}, {}
        for shard in sorted(set(mapping.values())):
            path = directory / shard
            if Path(shard).name != shard or not path.is_file():
                raise DataError(path, None, f"missing: {INDEX} lists it as a shard of the weights")
            held = opened[path] = _read(path)
            for name, where in mapping.items():
                if where == shard:
                    if name not in held:
                        raise DataError(path, None,
                                        f"tensor '{name}' is missing, though {INDEX} lists it here")
                    files[name] = path
        return Weights(files, opened)
    if (directory / PICKLED).is_file():
        path = directory / PICKLED
        if not allow_pickle:
            raise pickle_refused(path)
        return _whole(path)
    raise DataError(directory / SAFETENSORS, None,
                    f"missing: the model directory has neither {SAFETENSORS}, nor {INDEX} with its shards, "
                    f"nor {PICKLED}")
