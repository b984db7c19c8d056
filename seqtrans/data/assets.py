"""A task's vocabulary files ("assets": what :meth:`Task.build_vocabulary` writes), as a
run directory, a prepared dataset and a checkpoint hold them: read, written and
compared by one digest."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path


def read_assets(directory: Path) -> dict[str, bytes]:
    """The files of ``directory`` (not its subdirectories) by name."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def write_assets(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` as the directory ``directory`` (absent or empty), all or nothing."""
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, data in files.items():
        (partial / name).write_bytes(data)
    os.replace(partial, directory)


def assets_digest(files: Mapping[str, bytes]) -> str:
    """sha256 of the files' names and contents, in name order; part of the key of a
    prepared dataset, so it stays as it is."""
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
