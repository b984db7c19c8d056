"""The server's decoding workers: threads of this process that decode side by side.

PyTorch's CPU operators run on a team of OpenMP threads per calling thread, and a thread
that has run them keeps its team. So each worker is one thread that does all of its
PyTorch work (warming, decoding, streaming steps) itself, with a thread count of its
own (:func:`seqtrans.runtime.threads.worker_threads`), and the server runs ``workers x
threads`` computing threads in all, as CTranslate2's ``inter_threads x intra_threads``.
Threads, not processes: the workers share one copy of the weights and of the int8 and
oneDNN copies made from them, a request's :class:`~seqtrans.serving.batching.Deadline`
is seen by the worker decoding it without any messages, and a streaming session's state
stays in this process. PyTorch's operators and the native kernels release the GIL;
the Python of the search loop around them does not (docs/serving.md says what that costs).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

_local = threading.local()


def current_worker() -> str | None:
    """The name of the decoding worker this code runs in (``"0"``, ``"1"``, ...), or None
    outside the workers."""
    return getattr(_local, "worker", None)


def _start(index: int, threads: int | None) -> None:
    """A worker thread's first act: its name, and its own OpenMP team size."""
    _local.worker = str(index)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)  # this thread's team (and the native kernels', which ask it)


class Workers:
    """``count`` decoding workers, each a thread of its own (a one-thread executor) that
    computes with ``threads`` threads (None: the count PyTorch gives a new thread, the
    process's)."""

    def __init__(self, count: int = 1, *, threads: int | None = None) -> None:
        if count < 1:
            raise ValueError(f"workers: 1 or more, got {count}")
        self.threads = threads
        self.executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"seqtrans-decode-{i}",
                                             initializer=_start, initargs=(i, threads))
                          for i in range(count)]
        self._turns = itertools.cycle(range(count))

    def __len__(self) -> int:
        return len(self.executors)

    def __getitem__(self, index: int) -> ThreadPoolExecutor:
        return self.executors[index]

    def __iter__(self) -> Iterator[ThreadPoolExecutor]:
        return iter(self.executors)

    def next(self) -> ThreadPoolExecutor:
        """A worker for work that is not a batch (a streaming session): each in turn."""
        return self.executors[next(self._turns)]

    def shutdown(self, *, wait: bool = True) -> None:
        """Let each worker finish what it was given, and end its thread."""
        for executor in self.executors:
            executor.shutdown(wait=wait)


def decoding_workers(count: int = 1, *, threads: int | None = None) -> Workers:
    """The server's ``count`` workers, each with ``threads`` threads, or, without a count
    (``--threads``, ``$SEQTRANS_THREADS``), the process's threads shared among them
    (:func:`seqtrans.runtime.threads.worker_threads`)."""
    import torch

    from seqtrans.runtime.threads import worker_threads

    each = worker_threads(count, threads=threads, process=torch.get_num_threads())
    if count > 1:
        log.info("%d decoding workers of %s threads each", count, each)
    return Workers(count, threads=each)
