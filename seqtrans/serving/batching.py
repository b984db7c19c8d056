"""Dynamic batching: predict requests that arrive together are decoded together.

Requests wait in a bounded queue. The dispatcher takes the oldest, waits at most
``max_wait_ms`` from its arrival, or from when a worker came free if that is later, for
more requests with the same model and decoding settings (or until ``max_batch_tokens``
source tokens have arrived), and hands that batch
to a free decoding worker (:mod:`seqtrans.serving.workers`), so the event loop keeps
answering while the model decodes; with several workers, several batches decode at once,
and the dispatcher takes the next batch when a worker is free. Each
request gets its own outputs back, in its own order. A batch that fails is decoded again
request by request, so one bad request fails alone. A request carries its
:class:`Deadline`, which the decoder asks between decoding steps: a request past its
time limit, or withdrawn, leaves its batch at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from seqtrans.serving.workers import Workers, decoding_workers

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds its maximum of requests."""


class Stopped(Exception):
    """The batcher stopped before decoding the request."""


class Expired(Exception):
    """A decoder's result for a request whose deadline passed while it decoded."""


class Deadline:
    """When a request's answer stops being wanted: at the monotonic time ``at``, or once
    withdrawn (its client went away). The event loop withdraws; the decoding thread asks."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._withdrawn = threading.Event()

    def withdraw(self) -> None:
        self._withdrawn.set()

    @property
    def passed(self) -> bool:
        return self._withdrawn.is_set() or time.monotonic() >= self.at


@dataclass(eq=False)  # a job is itself: found in the queue by identity
class Job:
    """One request in the queue: ``key`` says which requests it may be decoded with (same
    model and settings); ``tokens`` is its size; ``work`` what the worker decodes."""

    key: Hashable
    tokens: int
    work: Any
    future: asyncio.Future[Any]
    arrived: float = field(default_factory=time.monotonic)


def take_batch(pending: deque[Job], max_tokens: int) -> list[Job]:
    """Remove from ``pending`` and return the oldest job and the later jobs of its key, in
    order, while their tokens fit ``max_tokens`` (the oldest always goes, however large).
    Jobs whose requests have gone (timed out, disconnected) are dropped."""
    while pending and pending[0].future.done():
        pending.popleft()
    if not pending:
        return []
    first = pending.popleft()
    batch, tokens, kept = [first], first.tokens, deque[Job]()
    while pending:
        job = pending.popleft()
        if job.future.done():
            continue
        if job.key == first.key and tokens + job.tokens <= max_tokens:
            batch.append(job)
            tokens += job.tokens
        else:
            kept.append(job)
    pending.extend(kept)
    return batch


#: Decodes the works of a batch (all of one key) and returns one result per work, in
#: order; an exception in place of a result fails that request alone.
Decoder = Callable[[Sequence[Any]], Sequence[Any]]


class Batcher:
    """The queue, its dispatcher task and the decoding workers (``workers``; by default
    one of its own, :func:`~seqtrans.serving.workers.decoding_workers`)."""

    def __init__(self, decoder: Decoder, *, max_tokens: int, max_wait_s: float, max_queue: int,
                 workers: Workers | None = None) -> None:
        self.decoder = decoder
        self.max_tokens = max_tokens
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.pending: deque[Job] = deque()
        self.workers = workers if workers is not None else decoding_workers()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._free: asyncio.LifoQueue[int] | None = None
        #: when each worker last came free (monotonic): the clients its batch answered send
        #: their next requests within a moment, and the next batch waits for them
        self._freed_at: dict[int, float] = {}
        self._running: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        # the worker freed last goes first: at low load one worker decodes, its caches warm
        self._free = asyncio.LifoQueue()
        for index in reversed(range(len(self.workers))):
            self._free.put_nowait(index)
        self._task = asyncio.get_running_loop().create_task(self._dispatch(), name="seqtrans-batcher")

    async def stop(self) -> None:
        """Stop taking batches (the requests still queued are answered with an error), let
        the workers finish the batches they are decoding and answer those."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.gather(*self._running, return_exceptions=True)
        while self.pending:
            job = self.pending.popleft()
            if not job.future.done():
                job.future.set_exception(Stopped())
        self.workers.shutdown(wait=True)

    @property
    def depth(self) -> int:
        """Requests waiting to be decoded (not those withdrawn a moment ago, whose removal
        from the queue is scheduled)."""
        return sum(not job.future.done() for job in self.pending)

    def submit(self, key: Hashable, tokens: int, work: Any) -> asyncio.Future[Any]:
        """Queue a request; its future gets the decoder's result (or exception). Cancel the
        future to withdraw the request if it has not started decoding. Raises
        :class:`QueueFull` when the queue is full."""
        if len(self.pending) >= self.max_queue:
            raise QueueFull
        job = Job(key, tokens, work, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        job.future.add_done_callback(lambda _: self._withdraw(job))
        self._arrived.set()
        return job.future

    def _withdraw(self, job: Job) -> None:
        """Take a request that has gone (timed out, cancelled) out of the queue at once, so
        that it no longer counts against ``max_queue``."""
        if job in self.pending:
            self.pending.remove(job)

    async def _dispatch(self) -> None:
        assert self._free is not None
        while True:
            while not self.pending:
                self._arrived.clear()
                await self._arrived.wait()
            worker = await self._free.get()  # requests gather meanwhile, when all are busy
            batch: list[Job] = []
            if self.pending:
                await self._gather(self.pending[0], self._freed_at.get(worker, 0.0))
                batch = take_batch(self.pending, self.max_tokens)
            if not batch:
                self._free.put_nowait(worker)
                continue
            task = asyncio.get_running_loop().create_task(self._run(worker, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, worker: int, batch: list[Job]) -> None:
        """Decode ``batch`` on the worker ``worker``, free it, and answer each request."""
        assert self._free is not None
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self.workers[worker], self._decode, [j.work for j in batch])
        except Exception as exc:  # the decoder's own failure; it never reaches here by design
            log.exception("decoding a batch failed")
            results = [exc] * len(batch)
        finally:
            self._freed_at[worker] = time.monotonic()
            self._free.put_nowait(worker)
        for job, result in zip(batch, results):
            if job.future.done():  # withdrawn while decoding
                continue
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)

    async def _gather(self, first: Job, freed_at: float) -> None:
        """Wait until ``first`` has waited ``max_wait_s`` (counted from ``freed_at``, when the
        worker came free, if that is later), or enough of its key has arrived. Under load the
        oldest request arrived while every worker was busy; counting from its arrival would
        send the requests that queued meanwhile at once, and the clients the last batch just
        answered would wait a whole batch: with a closed loop of users, each batch would
        hold about half of them."""
        start = max(first.arrived, freed_at)
        while True:
            left = start + self.max_wait_s - time.monotonic()
            if left <= 0 or first.future.done():
                return
            tokens = sum(j.tokens for j in self.pending if j.key == first.key and not j.future.done())
            if tokens >= self.max_tokens:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return

    def _decode(self, works: list[Any]) -> list[Any]:
        """The batch's results; if decoding them together fails, each is decoded alone so
        that the failure stays with the request that caused it."""
        try:
            return list(self.decoder(works))
        except Exception as exc:
            if len(works) == 1:
                return [exc]
        results: list[Any] = []
        for work in works:
            try:
                results.extend(self.decoder([work]))
            except Exception as exc:
                results.append(exc)
        return results
