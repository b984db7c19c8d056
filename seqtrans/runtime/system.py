"""What seqtrans asks of the operating system, with a fallback wherever a call is
Linux's alone (seqtrans is developed and tested on Linux; macOS and Windows are meant
to work through these fallbacks, untested):

- :func:`file_lock`: an exclusive lock between processes, with ``fcntl.flock`` where
  there is ``fcntl`` (Linux, macOS), ``msvcrt.locking`` on Windows, else a lock file
  created exclusively (``O_EXCL``);
- :func:`release_freed_memory`: ``malloc_trim`` where the C library has it (glibc),
  else only a garbage collection;
- :func:`keep_freed_memory`: glibc's ``mallopt``, so that freed blocks are reused rather
  than handed back and faulted in again (elsewhere it does nothing);
- :func:`release_mapped`: ``madvise(MADV_DONTNEED)`` over a tensor's pages where each is a
  page of the file it was mapped from, never written, so that they stop counting in the
  resident set (elsewhere it does nothing); :func:`mapped_file`: the file a tensor maps,
  to read it without bringing its pages back (``/proc/self/maps``; elsewhere None);
- :func:`cpu_features`: the processor's feature flags from ``/proc/cpuinfo``, else its
  name from :mod:`platform`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib
import mmap
import os
import platform
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is not imported here: commands that need no model load none
    from torch import Tensor

#: Where Linux describes the processor (a constant, so that tests can point it elsewhere).
CPUINFO = Path("/proc/cpuinfo")


def _module(name: str) -> ModuleType | None:
    """The standard-library module ``name`` where this platform has it, else None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@contextlib.contextmanager
def file_lock(path: Path, *, poll_s: float = 0.05) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) between processes for the
    block; other holders wait. The lock goes with the process if it dies, except with
    the lock-file fallback, where a lock left by a process that no longer runs is taken
    over."""
    fcntl, msvcrt = _module("fcntl"), _module("msvcrt")
    if fcntl is not None:
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    elif msvcrt is not None:
        with open(path, "a+b") as f:
            f.seek(0)
            while True:  # LK_LOCK gives up after ten tries of a second
                try:
                    msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    time.sleep(poll_s)
            try:
                yield
            finally:
                f.seek(0)
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        with _exclusive_file(path.with_name(path.name + ".held"), poll_s=poll_s):
            yield


@contextlib.contextmanager
def _exclusive_file(held: Path, *, poll_s: float) -> Iterator[None]:
    """The lock as a file that exists while it is held, holding the holder's process id."""
    while True:
        try:
            fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if _holder_is_gone(held):
                with contextlib.suppress(FileNotFoundError):
                    held.unlink()
            else:
                time.sleep(poll_s)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            held.unlink()


def _holder_is_gone(held: Path) -> bool:
    try:
        pid = int(held.read_text() or "0")
    except (OSError, ValueError):
        return False  # being written, or unreadable: wait
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


_libc: dict[str, Callable[..., int] | None] = {}  # each function looked up once


def _libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name``, or None where no C library is found (Windows)
    or it has no such function (``malloc_trim`` and ``mallopt`` are glibc's)."""
    if name not in _libc:
        found = None
        library = ctypes.util.find_library("c")
        if library:
            with contextlib.suppress(OSError):
                found = getattr(ctypes.CDLL(library), name, None)
        _libc[name] = found if callable(found) else None
    return _libc[name]


def _malloc_trim() -> Callable[..., int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, Windows, musl)."""
    return _libc_function("malloc_trim")


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
#: Freed memory at the top of the heap that glibc keeps rather than returns (1 GiB).
KEEP_AT_TOP = 1 << 30


def keep_freed_memory() -> bool:
    """Have the C library keep the memory of freed blocks for the next allocation of
    their size (glibc: no blocks of their own mapping, and up to :data:`KEEP_AT_TOP`
    freed at the top of the heap kept). With glibc's defaults every block over its
    mapping threshold, 32 MiB at most, is a mapping of its own, given back when freed and
    faulted in page by page when the next one is written: a decoding batch's tensors pay
    that at every layer (docs/speed.md, "Freed memory"). :func:`release_freed_memory`
    still gives everything back. Returns whether it applied (False where the C library
    has no ``mallopt`` or refused)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_AT_TOP))


def trim_freed_memory() -> None:
    """Return the C library's freed heap memory to the system, where it has
    ``malloc_trim`` (glibc), without a garbage collection: cheap enough to call after
    each of many large temporaries, whose freed blocks glibc otherwise keeps in pieces."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_freed_memory() -> None:
    """Return the memory of freed objects to the system: a garbage collection, then, where
    the C library has it, ``malloc_trim`` (glibc keeps freed blocks below its mapping
    threshold for reuse, and the process's resident set would still count them)."""
    gc.collect()
    trim_freed_memory()


MADV_DONTNEED = 4  # Linux's sys/mman.h
PAGEMAP = Path("/proc/self/pagemap")
# /proc/self/pagemap's flags of a page (Documentation/admin-guide/mm/pagemap.rst)
_PRESENT, _SWAPPED, _FILE = 1 << 63, 1 << 62, 1 << 61


def release_mapped(tensor: Tensor) -> bool:
    """Give back this process's pages of ``tensor`` where each is a page of a file it was
    mapped from (``torch.load(..., mmap=True)``) and never written: a later read faults it
    in again from the file (the page cache, as a rule), so the values are unchanged while
    they stop counting in the resident set. Where any of its pages holds data of the
    process's own (memory not mapped from a file, or a page written since), it is left
    alone: giving that back would lose it. Returns whether pages were given back (Linux
    only: ``/proc/self/pagemap`` and ``madvise``)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or not sys.platform.startswith("linux"):
        return False
    page = mmap.PAGESIZE
    address = tensor.data_ptr()
    start = -(-address // page) * page  # the whole pages inside the tensor's bytes only
    end = (address + tensor.numel() * tensor.element_size()) // page * page
    madvise = _libc_function("madvise")
    if end <= start or madvise is None:
        return False
    pages = _pages(start, end)
    if pages is None or pages[0].any() or not pages[1].any():
        return False
    return madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) == 0


def _pages(start: int, end: int) -> tuple[Any, Any] | None:
    """Which pages from ``start`` to ``end`` (page-aligned addresses) hold data of the
    process's own (written, so a private copy now, or never a file's) and which are
    resident, as two bool arrays; None where ``/proc/self/pagemap`` cannot say."""
    page = mmap.PAGESIZE
    try:
        with PAGEMAP.open("rb") as f:
            f.seek(start // page * 8)
            raw = f.read((end - start) // page * 8)
    except OSError:
        return None
    import numpy as np

    flags = np.frombuffer(raw, dtype=np.uint64)  # [pages]
    if len(flags) != (end - start) // page:
        return None
    present, swapped, file = ((flags & np.uint64(bit)) != 0 for bit in (_PRESENT, _SWAPPED, _FILE))
    return swapped | (present & ~file), present


#: Where Linux lists this process's maps of memory (a constant, so that tests can point it elsewhere).
MAPS = Path("/proc/self/maps")


class MappedFile:
    """The file a tensor's memory is a map of, open, and where the tensor's first byte lies
    in it (:func:`mapped_file`). Its bytes are read with ``pread``, which brings none of the
    file's pages into this process's resident set as a read through the map does (a whole
    folio of the file, 2 MiB on Linux 6's ext4, for one byte). Closed when dropped."""

    def __init__(self, fd: int, offset: int) -> None:
        self.offset = offset
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    def read_into(self, buffer: memoryview, at: int) -> None:
        """Fill ``buffer`` with the file's bytes from ``at`` bytes past the tensor's first byte."""
        got = os.preadv(self._fd, [buffer], self.offset + at)
        if got != len(buffer):
            raise OSError(f"read {got} of {len(buffer)} bytes: the file mapped is shorter than its map")


def mapped_file(tensor: Tensor) -> MappedFile | None:
    """The file ``tensor``'s memory is a map of (``torch.load(..., mmap=True)``), opened, where
    the whole tensor lies in one map and the file at its path is still the one mapped (the
    same device and inode); else None: memory of the process's own, a file renamed over or
    removed since, or no ``/proc/self/maps`` (Linux only). The file's bytes are the tensor's
    only where the tensor was never written (a written page of a private map is a copy),
    so where any page under it holds data of the process's own, None too."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or end <= start:
        return None
    page = mmap.PAGESIZE
    pages = _pages(start // page * page, -(-end // page) * page)  # every page it touches
    if pages is None or pages[0].any():
        return None
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # range, permissions, offset, device, inode, path
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if not low <= start < high:
            continue
        if end > high or len(fields) < 6 or not fields[5].startswith("/"):
            return None
        try:
            fd = os.open(fields[5], os.O_RDONLY)
        except OSError:
            return None
        found = os.fstat(fd)
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        if (found.st_ino, os.major(found.st_dev), os.minor(found.st_dev)) != (int(fields[4]), major, minor):
            os.close(fd)
            return None
        return MappedFile(fd, int(fields[2], 16) + start - low)
    return None


def cpu_features() -> str:
    """The processor's feature flags (the ``flags`` or ``Features`` line of
    ``/proc/cpuinfo``), else, where there is no such file, its name and architecture."""
    try:
        with open(CPUINFO, encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return f"{platform.processor()} {platform.machine()}".strip()
