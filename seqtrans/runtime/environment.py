"""The environment variables seqtrans reads, each read here and nowhere else, so that
one page lists what the environment can change. Imports no torch.

- ``SEQTRANS_TUNE_MATMUL=0``: CPU decoding multiplies with ``F.linear`` only
  (:mod:`seqtrans.linear`).
- ``SEQTRANS_PACK_WEIGHTS=0``: float32 CPU decoding multiplies with each weight as it is,
  without oneDNN's blocked copy beside it (less memory, slower;
  :mod:`seqtrans.linear.onednn`).
- ``SEQTRANS_PACK_BLOCK_MIB``: the largest block (MiB, default 32) in which a float32
  weight is packed and multiplied; ``0``: each weight in one block, faster where a product
  call costs most (batch 1, passive waits), a large weight resident twice while packed
  (:func:`pack_block_bytes`).
- ``SEQTRANS_STEP_TEAMS=0``: every decoding step computes with all the process's threads
  (:mod:`seqtrans.decoding.teams`).
- ``SEQTRANS_NATIVE=0``: CPU decoding builds and uses no native kernel
  (:mod:`seqtrans.native`); ``CC``: the C compiler that builds them (else ``cc``).
- ``SEQTRANS_NATIVE_STEP=0``: CPU decoding runs the decoder's layers one by one from
  Python, not in one native call per step (:mod:`seqtrans.linear.native_step`).
- ``SEQTRANS_CACHE_DIR``, ``XDG_CACHE_HOME``: where downloads are cached
  (:func:`seqtrans.runtime.download.cache_dir`).
- ``SEQTRANS_MIRROR``: where downloads are read from (:func:`seqtrans.runtime.download.mirror_url`).
- ``SEQTRANS_SERVE_TOKEN``: the bearer token ``seqtrans serve`` asks of its clients
  (:func:`serve_token`); kept out of the command line, which other users can read.
- ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``: this process's place in a job, as torchrun
  sets them (:mod:`seqtrans.training.world`).
- ``SEQTRANS_THREADS``: the threads a process computes with; ``OMP_NUM_THREADS``, the
  user's own count, is left to PyTorch when ``SEQTRANS_THREADS`` is unset
  (:mod:`seqtrans.runtime.threads`).
- ``SEQTRANS_WAIT_POLICY``: how OpenMP's idle threads wait (``active``, ``passive``, a
  spin count or ``default``), said to OpenMP as ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``,
  which a user may also set themselves (:func:`seqtrans.runtime.threads.set_wait_policy`).
- ``SEQTRANS_MALLOC``: ``keep`` (the default) has the ``seqtrans`` command keep freed
  memory for reuse, ``system`` leaves the C library's own policy
  (:func:`seqtrans.runtime.system.keep_freed_memory`).
- ``LRU_CACHE_CAPACITY``, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``: how many built oneDNN
  products PyTorch's cache and oneDNN's own keep (1,024 each unless set), which
  ``seqtrans serve`` bounds where they are unset
  (:func:`seqtrans.linear.onednn.bound_primitive_caches`).

:func:`setting` sets one for the processes seqtrans starts, inside a block; :func:`export`
for the rest of this process and those it starts (the thread count, before PyTorch
reads it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from seqtrans.errors import UsageError

TUNE_MATMUL = "SEQTRANS_TUNE_MATMUL"
NATIVE = "SEQTRANS_NATIVE"
STEP_TEAMS = "SEQTRANS_STEP_TEAMS"
NATIVE_STEP = "SEQTRANS_NATIVE_STEP"
PACK_WEIGHTS = "SEQTRANS_PACK_WEIGHTS"
PACK_BLOCK_MIB = "SEQTRANS_PACK_BLOCK_MIB"
CACHE_DIR = "SEQTRANS_CACHE_DIR"
MIRROR = "SEQTRANS_MIRROR"
SERVE_TOKEN = "SEQTRANS_SERVE_TOKEN"
THREADS = "SEQTRANS_THREADS"
OMP_THREADS = "OMP_NUM_THREADS"
WAIT_POLICY = "SEQTRANS_WAIT_POLICY"
OMP_WAIT_POLICY = "OMP_WAIT_POLICY"
GOMP_SPINCOUNT = "GOMP_SPINCOUNT"
MALLOC = "SEQTRANS_MALLOC"
MALLOC_POLICIES = ("keep", "system")
#: The capacities of PyTorch's (ideep's) cache of built oneDNN products and of oneDNN's own.
PRIMITIVE_CACHES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def threads() -> str:
    """``$SEQTRANS_THREADS``, or an empty string."""
    return os.environ.get(THREADS, "").strip()


def omp_threads() -> str:
    """``$OMP_NUM_THREADS``, or an empty string."""
    return os.environ.get(OMP_THREADS, "").strip()


def wait_policy() -> str:
    """``$SEQTRANS_WAIT_POLICY``, or an empty string."""
    return os.environ.get(WAIT_POLICY, "").strip()


def malloc() -> str:
    """``$SEQTRANS_MALLOC``: ``keep`` (also when unset) or ``system``, else a ValueError
    naming the variable."""
    value = os.environ.get(MALLOC, "").strip().lower() or "keep"
    if value not in MALLOC_POLICIES:
        raise ValueError(f"{MALLOC} must be keep or system, got {os.environ[MALLOC]!r}")
    return value


def primitive_cache_capacity(name: str) -> str:
    """``$name``, one of :data:`PRIMITIVE_CACHES`, or an empty string."""
    return os.environ.get(name, "").strip()


def export(name: str, value: str) -> None:
    """Set ``$name`` for the rest of this process and the processes it starts."""
    os.environ[name] = value


def remove(name: str) -> None:
    """Unset ``$name`` for the rest of this process and the processes it starts."""
    os.environ.pop(name, None)


def pack_weights() -> bool:
    """Whether float32 CPU decoding keeps oneDNN's blocked copy of each weight (on unless
    ``SEQTRANS_PACK_WEIGHTS=0``)."""
    return os.environ.get(PACK_WEIGHTS, "1") != "0"


def pack_block_bytes(default: int) -> int | None:
    """The largest block of a packed float32 weight in bytes: ``SEQTRANS_PACK_BLOCK_MIB``
    MiB where set, else ``default``; None for one block per weight (``0``). UsageError
    naming the variable for anything but a whole number of MiB."""
    value = os.environ.get(PACK_BLOCK_MIB)
    if value is None:
        return default
    if not value.strip().isdigit():
        raise UsageError(f"{PACK_BLOCK_MIB} must be a whole number of MiB (0: one block per weight), "
                         f"not {value!r}")
    return int(value) << 20 or None


def tune_matmul() -> bool:
    """Whether CPU decoding may choose among equivalent matrix multiplies (on unless
    ``SEQTRANS_TUNE_MATMUL=0``)."""
    return os.environ.get(TUNE_MATMUL, "1") != "0"


def step_teams() -> bool:
    """Whether small decoding steps may compute with fewer threads where that was measured
    faster (on unless ``SEQTRANS_STEP_TEAMS=0``)."""
    return os.environ.get(STEP_TEAMS, "1") != "0"


def native_step() -> bool:
    """Whether an int8 decoding copy made now may run its decoder's layers in one native
    call per step (on unless ``SEQTRANS_NATIVE_STEP=0``)."""
    return os.environ.get(NATIVE_STEP, "1") != "0"


def native_kernels() -> bool:
    """Whether CPU decoding may build and use native kernels (on unless ``SEQTRANS_NATIVE=0``)."""
    return os.environ.get(NATIVE, "1") != "0"


def c_compiler() -> str:
    """``$CC``, or an empty string."""
    return os.environ.get("CC") or ""


def serve_token() -> str | None:
    """``$SEQTRANS_SERVE_TOKEN``, or None when it is unset or empty."""
    return os.environ.get(SERVE_TOKEN) or None


def cache_dir() -> str:
    """``$SEQTRANS_CACHE_DIR``, or an empty string."""
    return os.environ.get(CACHE_DIR) or ""


def xdg_cache_home() -> str:
    """``$XDG_CACHE_HOME``, or an empty string."""
    return os.environ.get("XDG_CACHE_HOME") or ""


def mirror() -> str:
    """``$SEQTRANS_MIRROR``, or an empty string."""
    return os.environ.get(MIRROR) or ""


def torchrun_world() -> tuple[int, int, int]:
    """(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``), (1, 0, 0) where unset; ValueError
    when one is not an integer."""
    return (int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
            int(os.environ.get("LOCAL_RANK", "0")))


@contextmanager
def setting(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` inside the block (for the processes started there),
    as it was after it."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
