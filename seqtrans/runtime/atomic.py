"""Files written whole or not at all: the content goes to a temporary file beside the
target, which is then renamed over it.

A crash at any moment leaves either the old file or the new one, never a torn one; a
write that fails leaves the old one and removes the temporary file. A process killed
mid-write leaves its temporary file, named ``.NAME.XXXXXXXX.tmp``
(:func:`is_temporary`), which readers of the directory ignore or remove.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

_TEMPORARY = re.compile(r"^\..+\.tmp$")


def is_temporary(name: str) -> bool:
    """Whether a file name is that of a temporary file an interrupted write left."""
    return bool(_TEMPORARY.match(name))


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new file beside ``path`` with a name no other writer has, open for writing; its
    mode is that of any new file (0o666 less the umask)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


@contextmanager
def replacing(path: str | Path, *, durable: bool = False) -> Iterator[BinaryIO]:
    """A binary file for ``path``'s new content: renamed over ``path`` when the block ends,
    removed when the block raises. Creates ``path``'s directory when it is missing.

    ``durable``: the file and the rename are flushed to disk before the block returns,
    for files that a power loss must not take back (checkpoints).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` itself durable."""
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - platforms without directory fsync
        pass


def write_bytes(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Write ``data`` as the whole content of ``path``, atomically."""
    with replacing(path, durable=durable) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) as the whole content of ``path``, atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any, *, sort_keys: bool = True, ensure_ascii: bool = True) -> Path:
    """Write ``data`` as indented JSON with a final line break, atomically."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + "\n")


@contextmanager
def new_directory(path: str | Path) -> Iterator[Path]:
    """A scratch directory beside ``path``, to be filled in the block: renamed to ``path``
    when the block ends, removed with everything in it when the block raises. ``path``
    must not exist (or be an empty directory); nothing half-written is ever left there."""
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield scratch
        os.rename(scratch, path)  # fails if a non-empty directory appeared at path meanwhile
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
