"""Reading and writing the weight files of a Hugging Face model directory:
``model.safetensors`` (read through a memory map, so that a tensor is read only when
it is used; or a tensor at a time into memory of its own, :func:`read_stored`)
and, for older models, ``pytorch_model.bin`` (loaded with
``weights_only=True``: a file holding pickled code is refused, never run).

The safetensors layout: an 8-byte little-endian header length, a JSON header mapping
each tensor name to its dtype, shape and byte range, then the bytes.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seqtrans.plugin import DataError

SAFETENSORS = "model.safetensors"
PICKLED = "pytorch_model.bin"

_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def pickle_refused(path: Path) -> DataError:
    """The error of a pickled weight file read without the user's leave."""
    return DataError(path, None, "is a pickle, and loading a pickle can run any code it holds: it is read "
                                 "only with --allow-pickle (allow_pickle=True); a safetensors copy of the "
                                 "model needs neither")


def weights_file(directory: Path, *, allow_pickle: bool = False) -> Path:
    """The model's weight file: model.safetensors, else pytorch_model.bin where ``allow_pickle``."""
    for name in (SAFETENSORS, PICKLED):
        if (directory / name).is_file():
            if name == PICKLED and not allow_pickle:
                raise pickle_refused(directory / name)
            return directory / name
    raise DataError(
        directory / SAFETENSORS, None, f"missing: the model directory has neither {SAFETENSORS} nor {PICKLED}"
    )


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a weight file by name (float tensors as stored)."""
    if path.name.endswith(".safetensors"):
        return read_safetensors(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # UnpicklingError for pickled code; anything else for a damaged file
        raise DataError(
            path,
            None,
            "not a plain weight file: it holds pickled code or objects other than "
            f"tensors, which are never loaded ({type(exc).__name__}: {str(exc)[:200]})",
        ) from None
    if not isinstance(loaded, Mapping) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise DataError(path, None, "does not hold a mapping of tensor names to tensors")
    return dict(loaded)


@dataclass(frozen=True)
class Stored:
    """Where a safetensors file keeps one tensor: its dtype, shape and byte range (from
    the file's start)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def safetensors_index(path: Path) -> dict[str, Stored]:
    """The tensors a safetensors file holds, by name, each checked to fit the file; the
    file's data is not read."""
    with path.open("rb") as f:
        length = f.seek(0, 2)
        f.seek(0)
        if length == 0:
            raise DataError(path, None, "empty, not a safetensors file")
        if length < 8:
            raise DataError(path, None, "truncated: shorter than a safetensors header")
        (size,) = struct.unpack("<Q", f.read(8))
        if 8 + size > length:
            raise DataError(
                path, None, f"not a safetensors file: its header claims {size} bytes, more than the file"
            )
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, None, f"not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise DataError(path, None, "not a safetensors file: its header is not a JSON object")
    return {name: _stored(path, name, entry, 8 + size, length)
            for name, entry in header.items() if name != "__metadata__"}


def _stored(path: Path, name: str, entry: Any, start: int, length: int) -> Stored:
    try:
        dtype = _DTYPES[entry["dtype"]]
        shape = tuple(int(n) for n in entry["shape"])
        begin, end = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise DataError(
            path, None, f"tensor '{name}': unreadable entry {entry!r} (dtypes read: {', '.join(_DTYPES)})"
        ) from None
    count = end - begin
    itemsize = torch.empty((), dtype=dtype).element_size()
    if count < 0 or start + end > length or count != itemsize * _numel(list(shape)):
        raise DataError(
            path,
            None,
            f"tensor '{name}': its byte range {begin}-{end} does not fit the file or its shape {list(shape)}",
        )
    return Stored(dtype, shape, start + begin, count)


def read_stored(f: BufferedReader, stored: Stored) -> Tensor:
    """The tensor ``stored`` says where to find in the open file ``f``, read into memory of
    its own (not a map of the file, whose pages would stay resident after the tensor is
    copied elsewhere)."""
    out = torch.empty(stored.shape, dtype=stored.dtype)
    if stored.nbytes:
        view = out.view(-1).view(torch.uint8).numpy().data  # the tensor's own bytes
        f.seek(stored.offset)
        done = 0
        while done < stored.nbytes:
            got = f.readinto(view[done:])
            if not got:
                raise DataError(Path(f.name), None, "truncated while it was read")
            done += got
    return out


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors file, as views of a map of the file (read only when used)."""
    index = safetensors_index(path)
    with path.open("rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors = {}
    for name, s in index.items():
        itemsize = torch.empty((), dtype=s.dtype).element_size()
        flat = (
            torch.frombuffer(buffer, dtype=s.dtype, count=s.nbytes // itemsize, offset=s.offset)
            if s.nbytes
            else torch.empty(0, dtype=s.dtype)
        )
        tensors[name] = flat.view(s.shape)
    return tensors


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def write_safetensors(path: Path, tensors: Mapping[str, Tensor]) -> None:
    """Write ``tensors`` (contiguous copies on the CPU) as a safetensors file."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    order = sorted(tensors)
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in order:
            t = tensors[name].detach().cpu().contiguous()
            if t.numel():
                f.write(t.view(-1).view(torch.uint8).numpy().data)  # a view, no copy
