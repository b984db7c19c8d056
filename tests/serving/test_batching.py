"""The batcher on its own, with a recording decoder: which requests go together, in what
order, a failing request failing alone, and batches decoding side by side on several workers."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import pytest

from seqtrans.serving.batching import Batcher, Job, QueueFull, Stopped, take_batch
from seqtrans.serving.workers import Workers, current_worker


def _jobs(loop: asyncio.AbstractEventLoop, specs: list[tuple[str, int]]) -> deque[Job]:
    return deque(Job(key, tokens, i, loop.create_future()) for i, (key, tokens) in enumerate(specs))


def test_a_batch_is_the_oldest_request_and_later_ones_of_its_key_within_the_token_budget() -> None:
    loop = asyncio.new_event_loop()
    pending = _jobs(loop, [("a", 30), ("b", 5), ("a", 50), ("a", 30), ("a", 40), ("b", 5)])
    assert [j.work for j in take_batch(pending, 100)] == [0, 2]  # 30 + 50; 30 more would pass 100
    assert [j.work for j in pending] == [1, 3, 4, 5]  # the others keep their order
    pending[1].future.cancel()
    assert [j.work for j in take_batch(pending, 100)] == [1, 5]
    assert [j.work for j in take_batch(pending, 10)] == [4]  # alone, however large
    assert take_batch(pending, 100) == []
    loop.close()


class Recorder:
    """Decodes a work w to w * 10 and remembers each batch; work 13 fails."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, works: Sequence[int]) -> list[int]:
        self.batches.append(list(works))
        if 13 in works:
            raise ValueError("unlucky")
        return [w * 10 for w in works]


def test_requests_arriving_together_are_decoded_together_and_a_failure_stays_with_its_request() -> None:
    decoder = Recorder()

    async def scenario() -> list[Any]:
        batcher = Batcher(decoder, max_tokens=100, max_wait_s=0.2, max_queue=8)
        batcher.start()
        futures = [batcher.submit("k", 1, w) for w in (1, 13, 2, 3)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop()
        return results

    results = asyncio.run(scenario())
    assert results[0] == 10 and results[2:] == [20, 30]
    assert isinstance(results[1], ValueError)
    assert decoder.batches == [[1, 13, 2, 3], [1], [13], [2], [3]]  # together, then alone after the failure


def test_a_full_queue_refuses_a_withdrawn_request_frees_its_place_and_stopping_answers_the_rest() -> None:
    async def scenario() -> None:
        batcher = Batcher(Recorder(), max_tokens=100, max_wait_s=10, max_queue=2)
        first = batcher.submit("k", 1, 1)
        batcher.submit("k", 1, 2)
        with pytest.raises(QueueFull):
            batcher.submit("k", 1, 3)
        first.cancel()
        await asyncio.sleep(0)  # the done callback runs on the loop
        assert batcher.depth == 1
        last = batcher.submit("k", 1, 4)
        await batcher.stop()
        assert isinstance(last.exception(), Stopped)  # answered, not left waiting

    asyncio.run(scenario())


class Meeting:
    """A decoder whose batches wait for each other: a batch returns only once ``parties``
    batches are decoding at the same time (else it fails after ``timeout`` seconds);
    it records the worker, and the worker's threads, of each."""

    def __init__(self, parties: int, *, timeout: float = 20) -> None:
        self.barrier = threading.Barrier(parties, timeout=timeout)
        self.seen: list[tuple[str | None, int]] = []

    def __call__(self, works: Sequence[int]) -> list[int]:
        import torch

        self.seen.append((current_worker(), torch.get_num_threads()))
        self.barrier.wait()
        return [w * 10 for w in works]


def test_two_workers_decode_two_batches_at_once_each_with_its_own_threads() -> None:
    decoder = Meeting(2)

    async def scenario() -> list[Any]:
        batcher = Batcher(decoder, max_tokens=100, max_wait_s=0, max_queue=8, workers=Workers(2, threads=1))
        batcher.start()
        futures = [batcher.submit("a", 1, 1), batcher.submit("b", 1, 2)]  # two keys: two batches
        results = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop()
        return results

    assert asyncio.run(scenario()) == [10, 20]  # one worker alone would have broken the barrier
    assert sorted(decoder.seen) == [("0", 1), ("1", 1)]


def test_one_worker_decodes_one_batch_at_a_time() -> None:
    decoder = Meeting(2, timeout=0.5)

    async def scenario() -> list[Any]:
        batcher = Batcher(decoder, max_tokens=100, max_wait_s=0, max_queue=8, workers=Workers(1))
        batcher.start()
        results = await asyncio.gather(batcher.submit("a", 1, 1), batcher.submit("b", 1, 2),
                                       return_exceptions=True)
        await batcher.stop()
        return results

    results = asyncio.run(scenario())
    assert all(isinstance(r, threading.BrokenBarrierError) for r in results)  # never two at once
    assert [worker for worker, _ in decoder.seen] == ["0", "0"]


def test_stopping_answers_the_batches_the_workers_are_decoding() -> None:
    started, release = threading.Event(), threading.Event()

    def slow(works: Sequence[int]) -> list[int]:
        started.set()
        release.wait(20)
        return [w + 1 for w in works]

    async def scenario() -> tuple[Any, Any]:
        batcher = Batcher(slow, max_tokens=1, max_wait_s=0, max_queue=8, workers=Workers(2))
        batcher.start()
        decoding = batcher.submit("k", 1, 1)
        while not started.is_set():
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().call_later(0.2, release.set)
        await batcher.stop()
        queued_after = batcher.submit("k", 1, 5)  # nobody takes it any more
        return decoding.result(), queued_after.done()

    assert asyncio.run(scenario()) == (2, False)


def test_the_next_batch_waits_for_the_clients_the_last_batch_answered() -> None:
    # One worker: request 1 decodes; request 2 queues meanwhile. When the worker comes free,
    # request 2 has waited longer than max_wait_s already, but the next batch still waits up
    # to max_wait_s from that moment, so request 3, sent by the client batch 1 answered just
    # after its answer, joins request 2 instead of waiting a whole batch.
    decoder = Recorder()
    release = threading.Event()

    def slow_first(works: Sequence[int]) -> list[int]:
        if works == [1]:
            release.wait(5)
        return decoder(works)

    async def scenario() -> list[Any]:
        batcher = Batcher(slow_first, max_tokens=100, max_wait_s=0.3, max_queue=8, workers=Workers(1))
        batcher.start()
        first = batcher.submit("k", 1, 1)
        await asyncio.sleep(0.45)  # request 1 waited its 0.3 s alone and is decoding
        second = batcher.submit("k", 1, 2)
        await asyncio.sleep(0.4)  # request 2 has waited past max_wait_s
        release.set()
        answered = await first
        third = batcher.submit("k", 1, 3)  # its client's next request, sent on the answer
        results = [answered, *await asyncio.gather(second, third)]
        await batcher.stop()
        return results

    assert asyncio.run(scenario()) == [10, 20, 30]
    assert decoder.batches == [[1], [2, 3]]
