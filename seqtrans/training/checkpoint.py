"""Checkpoints: written atomically, pruned to the last K, averaged.

A checkpoint is self-contained: the resolved run config, the task's vocabulary
files ("assets") and the model weights, plus, for training checkpoints, everything
needed to resume exactly (optimizer, step, data position, random states).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seqtrans.errors import CheckpointError

FORMAT = 1
_NAME = re.compile(r"^checkpoint_(\d+)\.pt$")


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def save_atomic(payload: Mapping[str, Any], path: str | Path) -> None:
    """Write to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.

    A crash at any moment leaves either the old file or the new one, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(dict(payload), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # pragma: no cover - platforms without directory fsync
        pass


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by seqtrans; a clear error if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "model" not in payload:
        raise CheckpointError(f"{path}: not a seqtrans checkpoint (format {FORMAT})")
    return payload


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


def average_weights(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the models' parameters (paper, section 6.1).

    Floating-point tensors are summed in float64 and cast back; other tensors are
    taken from the last checkpoint.
    """
    return _average(paths)[0]


def _average(paths: Sequence[str | Path]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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
