"""Checkpoints: written atomically, verified by a digest, pruned to the last K, averaged.

A checkpoint is self-contained: the resolved run config, the task's vocabulary
files ("assets") and the model weights, plus, for training checkpoints, everything
needed to resume exactly (optimizer, step, data position, random states).

Every checkpoint carries ``digest``, a sha256 of its whole content (every tensor's
bytes, dtype and shape, and every other value), checked when it is loaded: a
truncated or corrupted file is reported by name instead of being resumed from or
averaged. Files are loaded with ``weights_only=True``: tensors and plain data only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seqtrans.errors import CheckpointError
from seqtrans.runtime import atomic
from seqtrans.runtime.system import release_mapped

log = logging.getLogger(__name__)

FORMAT = 1
#: How many bytes of a tensor the digest reads at a time (the same hash as all at once).
HASHED_BLOCK = 16 << 20
_NAME = re.compile(r"^checkpoint_(\d+)\.pt$")
#: The model of the best validation so far (by the task's metric and its direction), in
#: a run's ``checkpoints/``: a model-only checkpoint, never pruned nor averaged.
BEST = "best.pt"
#: The suffix a damaged checkpoint is renamed with: kept for inspection, never loaded.
DAMAGED = ".damaged"


def digest(payload: Mapping[str, Any], *, read: Callable[[torch.Tensor], object] | None = None) -> str:
    """sha256 of a checkpoint's content, ``digest`` itself excluded; ``read`` is called
    with each block of a tensor's bytes (:data:`HASHED_BLOCK`) once they are hashed."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != "digest"}, read)
    return h.hexdigest()


def _feed(h: Any, value: Any, read: Callable[[torch.Tensor], object] | None) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        flat = t.reshape(-1).view(torch.uint8)
        for start in range(0, flat.numel(), HASHED_BLOCK):
            block = flat[start:start + HASHED_BLOCK]
            h.update(block.numpy().data)
            if read is not None:
                read(block)
    elif isinstance(value, Mapping):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _feed(h, value[key], read)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for item in value:
            _feed(h, item, read)
    else:
        h.update(f"V{value!r}".encode())


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def save_atomic(payload: Mapping[str, Any], path: str | Path) -> None:
    """Write to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.

    A crash at any moment leaves either the old file or the new one, never a torn one;
    a write that fails (a full disk) leaves the old one and raises :class:`CheckpointError`.
    The payload gets its ``digest``.
    """
    path = Path(path)
    payload = {**payload, "digest": digest(payload)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be written: {exc.strerror or exc}") from None
    try:
        with atomic.replacing(path, durable=True) as f:
            torch.save(payload, f)
    except OSError as exc:
        raise CheckpointError(f"{path}: writing it failed: {exc.strerror or exc} (nothing was replaced: "
                              "the files written before it are intact)") from None


def load(path: str | Path, *, mapped: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by seqtrans; a clear error if it is not one. ``mapped``:
    its tensors are views of a map of the file, read as they are used, and the pages the
    digest's check read are given back (:func:`seqtrans.runtime.system.release_mapped`),
    so that loading holds no copy of the weights; they must not be written then."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "model" not in payload:
        raise CheckpointError(f"{path}: not a seqtrans checkpoint (format {FORMAT})")
    if "digest" not in payload:
        log.warning("%s: has no digest (written by an earlier seqtrans); its content is not verified", path)
    elif payload["digest"] != digest(payload, read=release_mapped if mapped else None):
        raise CheckpointError(f"{path}: damaged: its content does not match the digest it was written with")
    return payload


def load_newest(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest step checkpoint of ``directory`` that loads and verifies, or None when
    there is none. Newer ones that are damaged are renamed with the suffix
    :data:`DAMAGED` (kept, never loaded again) and reported; when every checkpoint is
    damaged, :class:`CheckpointError` names them."""
    found = list_checkpoints(directory)
    damaged: list[str] = []
    for path in reversed(found):
        try:
            payload = load(path)
        except CheckpointError as exc:
            log.warning("%s; falling back to the checkpoint before it", exc)
            damaged.append(str(exc))
            set_aside(path)
            continue
        return path, payload
    if damaged:
        raise CheckpointError("no usable checkpoint: " + "; ".join(damaged))
    return None


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint so that it is neither loaded nor pruned again."""
    target = path.with_name(path.name + DAMAGED)
    os.replace(path, target)
    return target


def remove_temporary(directory: str | Path) -> None:
    """Delete what an interrupted :func:`save_atomic` left behind in ``directory``."""
    directory = Path(directory)
    if directory.is_dir():
        for p in directory.iterdir():
            if atomic.is_temporary(p.name):
                p.unlink(missing_ok=True)


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Step checkpoints in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints."""
    for path in list_checkpoints(directory)[:-keep]:
        path.unlink(missing_ok=True)


def _average(paths: Sequence[str | Path]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The element-wise mean of the models' parameters (paper, section 6.1), and the last
    checkpoint. Floating-point tensors are summed in float64 and cast back; other tensors
    are taken from the last checkpoint."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    payload: dict[str, Any] = {}
    names: set[str] | None = None
    for path in paths:
        payload = load(path)
        weights = payload["model"]
        if names is None:
            names = set(weights)
        elif set(weights) != names:
            raise CheckpointError(f"{path}: its parameters differ from those of {paths[0]}")
        for name, tensor in weights.items():
            if tensor.is_floating_point():
                acc = total.get(name)
                total[name] = tensor.double() if acc is None else acc + tensor.double()
    last = payload["model"]
    averaged = {name: (total[name] / len(paths)).to(t.dtype) if t.is_floating_point() else t
                for name, t in last.items()}
    return averaged, payload


def average(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Write a model-only checkpoint holding the average of ``paths``; config and assets
    come from the last one."""
    weights, last = _average(paths)
    payload = {"format": FORMAT, "config": last["config"], "assets": last.get("assets", {}),
               "model": weights, "averaged": [str(p) for p in paths]}
    save_atomic(payload, out)
    return Path(out)
