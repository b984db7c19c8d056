"""Large product outputs written into memory reused from one decoding step to the next.

A decoding step over a large vocabulary writes its logits [rows, V] as float32: 64 MiB for
64 rows (16 sentences at beam 4) of NLLB-200's 256,206 words. glibc's malloc gives an
allocation that large (above its 32 MiB ceiling for heap allocations) fresh pages from the
kernel every time, zeroed and faulted in one by one when first written, and returns them
when it is freed: at every step. On a 2-core AMD EPYC that was a quarter of a step
(docs/speed.md, "Logits in reused memory"). Within :func:`reused`, the products that write
such outputs (:func:`output`) take them from one buffer per thread, which lasts until the
scope ends. A step's output is written into it again only once nothing outside refers to
the previous one, so that a caller holding an earlier step's logits never sees them change.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

#: Outputs smaller than this come from ``torch.empty`` even within :func:`reused`: the
#: allocator serves them from memory it keeps.
MIN_BYTES = 8 << 20

_local = threading.local()


@contextmanager
def reused() -> Iterator[None]:
    """Within: :func:`output` of at least :data:`MIN_BYTES` reuses this thread's buffer.
    Scopes nest; the buffer is given back when the outermost ends."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth
        if depth == 0:
            _local.buffer = None


def output(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """An uninitialised CPU tensor of ``shape`` for a product to write: a view of this
    thread's buffer within :func:`reused` (grown to fit, and only where nothing else refers
    to the buffer, the previous output included), otherwise ``torch.empty``."""
    if getattr(_local, "depth", 0) == 0:
        return torch.empty(shape, dtype=dtype)
    size = math.prod(shape) * dtype.itemsize
    if size < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    buffer: Tensor | None = getattr(_local, "buffer", None)
    if buffer is not None and not _unshared(buffer):
        return torch.empty(shape, dtype=dtype)  # the last output is still held: leave it as it is
    if buffer is None or buffer.numel() < size:
        _local.buffer = None  # freed before its successor is made: the two are never held at once
        buffer = _local.buffer = torch.empty(size, dtype=torch.uint8)
    return buffer[:size].view(dtype).view(shape)


def _unshared(buffer: Tensor) -> bool:
    """Whether only ``buffer`` itself holds its memory: each view handed out (and each view
    of those, each array over them) holds it too. Where this PyTorch cannot count them, the
    buffer is never reused."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return False
    storage = buffer.untyped_storage()  # itself one more holder while it lives
    return bool(counter(storage._cdata) == 2)
