"""Reading and writing the weight files of a Hugging Face model directory:
``model.safetensors`` (read through a memory map, so that a tensor is read only when
it is used) and, for older models, ``pytorch_model.bin`` (loaded with
``weights_only=True``: a file holding pickled code is refused, never run).

The safetensors layout: an 8-byte little-endian header length, a JSON header mapping
each tensor name to its dtype, shape and byte range, then the bytes.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path

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


def read_safetensors(path: Path) -> dict[str, Tensor]:
    with path.open("rb") as f:
        try:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except ValueError:  # an empty file cannot be mapped
            raise DataError(path, None, "empty, not a safetensors file") from None
    if len(buffer) < 8:
        raise DataError(path, None, "truncated: shorter than a safetensors header")
    (size,) = struct.unpack("<Q", buffer[:8])
    if 8 + size > len(buffer):
        raise DataError(
            path, None, f"not a safetensors file: its header claims {size} bytes, more than the file"
        )
    try:
        header = json.loads(bytes(buffer[8 : 8 + size]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, None, f"not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise DataError(path, None, "not a safetensors file: its header is not a JSON object")
    start = 8 + size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = [int(n) for n in entry["shape"]]
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise DataError(
                path, None, f"tensor '{name}': unreadable entry {entry!r} (dtypes read: {', '.join(_DTYPES)})"
            ) from None
        count = end - begin
        itemsize = torch.empty((), dtype=dtype).element_size()
        if count < 0 or start + end > len(buffer) or count != itemsize * _numel(shape):
            raise DataError(
                path,
                None,
                f"tensor '{name}': its byte range {begin}-{end} does not fit the file or its shape {shape}",
            )
        flat = (
            torch.frombuffer(buffer, dtype=dtype, count=count // itemsize, offset=start + begin)
            if count
            else torch.empty(0, dtype=dtype)
        )
        tensors[name] = flat.view(shape)
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
