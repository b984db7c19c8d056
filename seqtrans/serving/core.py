"""The decoding core of the server, without a web framework: the models loaded at start,
by name; predict and score requests checked (:mod:`seqtrans.serving.requests`), queued and
decoded together in batches (:mod:`seqtrans.serving.batching`) within their time limit;
warming the models up; and streaming sessions (:mod:`seqtrans.serving.streams`). What it
refuses is a :class:`~seqtrans.serving.errors.RequestError` by code; the app
(:mod:`seqtrans.serving.app`) turns requests into calls here and errors into statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

from torch import Tensor

from seqtrans.attention import reading
from seqtrans.data.batches import source_ids
from seqtrans.data.vocab import EOS
from seqtrans.decoding import generate
from seqtrans.decoding.ensemble import position_limit
from seqtrans.decoding.search import Hypothesis
from seqtrans.errors import SeqtransError
from seqtrans.inference.details import attention_weights
from seqtrans.inference.scoring import score_ids
from seqtrans.serving import answers
from seqtrans.serving.batching import Batcher, Deadline, Expired, QueueFull, Stopped
from seqtrans.serving.errors import RequestError, clip
from seqtrans.serving.metrics import Metrics
from seqtrans.serving.models import Served
from seqtrans.serving.requests import Prediction, Scoring, parse_predict, parse_score
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.streams import Stream, StreamSlots
from seqtrans.serving.workers import Workers, current_worker, decoding_workers

log = logging.getLogger(__name__)
#: What a decoding worker gets of a request: its model, the checked request, its deadline.
Work = tuple[Served, Prediction | Scoring, Deadline]
#: Returns when a request's client has gone away.
Gone = Callable[[], Awaitable[Any]]


class Core:
    """The models, the batcher and its workers, the metrics and readiness."""

    def __init__(self, models: Mapping[str, Served], settings: ServeSettings,
                 workers: Workers | None = None) -> None:
        self.models = dict(models)
        self.settings = settings
        self.workers = workers
        self.metrics = Metrics()
        self.batcher: Batcher | None = None
        self.ready = False
        self.slots = StreamSlots(limit=settings.max_streams, gauge=self.metrics.streams)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The batcher while the context lasts; the models warm up in each of its workers
        meanwhile, and the core is :attr:`ready` once they have."""
        workers = self.workers if self.workers is not None else decoding_workers(self.settings.workers)
        batcher = Batcher(self.decode, max_tokens=self.settings.max_batch_tokens,
                          max_wait_s=self.settings.max_wait_ms / 1000, max_queue=self.settings.max_queue,
                          workers=workers)
        self.batcher = batcher
        batcher.start()
        warming = asyncio.ensure_future(self._warm_workers(workers))
        warming.add_done_callback(self._warmed)
        try:
            yield
        finally:
            await batcher.stop()

    def model(self, name: str) -> Served:
        served = self.models.get(name)
        if served is None:
            raise RequestError("unknown_model", f"no model named {clip(name)!r}; GET /v1/models lists them")
        return served

    async def predict(self, served: Served, body: Any, *, arrived: float, gone: Gone) -> dict[str, Any]:
        """The answer to a predict request ``body`` (parsed JSON) that arrived at the
        monotonic time ``arrived``, decoded with the requests queued beside it."""
        prediction = parse_predict(served, body, self.settings)
        result = await self.submit(served, (served.name, prediction.decode), prediction, arrived, gone)
        return {"model": served.name, "outputs": result}

    async def score(self, served: Served, body: Any, *, arrived: float, gone: Gone) -> dict[str, Any]:
        """The answer to a score request ``body``, as :meth:`predict`."""
        scoring = parse_score(served, body, self.settings)
        result = await self.submit(served, (served.name, "score"), scoring, arrived, gone)
        return {"model": served.name, "scores": result}

    async def submit(self, served: Served, key: Hashable, work: Prediction | Scoring, arrived: float,
                     gone: Gone) -> Any:
        """The result of a request through the batcher, within the time limit; a request
        that passes it, or whose client is ``gone``, leaves the queue at once, or its batch
        at the next decoding step."""
        assert self.batcher is not None, "the core is running"
        self.metrics.queue_depth.observe(self.batcher.depth)
        deadline = Deadline(arrived + self.settings.timeout_s)
        try:
            future = self.batcher.submit(key, work.tokens, (served, work, deadline))
        except QueueFull:
            raise RequestError("queue_full", f"{self.settings.max_queue} requests are waiting already; try "
                               "again shortly", limit="max_queue", retry_after=1) from None
        self.metrics.queued.set(self.batcher.depth)
        left = self.settings.timeout_s - (time.monotonic() - arrived)
        went = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({future, went}, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED)
            if not future.done() or isinstance(future.exception(), Expired):
                deadline.withdraw()  # leaves its batch at the next step
                future.cancel()  # or the queue
                if went.done():
                    self.metrics.disconnected.inc()
                    raise RequestError("client_disconnected", "the client went away before its answer")
                raise RequestError("timeout", f"not decoded within {self.settings.timeout_s:g} s",
                                   limit="timeout_s")
            return future.result()
        except SeqtransError as exc:
            raise RequestError("decoding_failed", str(exc)) from None
        except Stopped:
            raise RequestError("shutting_down", "the server stopped before decoding this request",
                               retry_after=1) from None
        finally:
            went.cancel()
            deadline.withdraw()  # in case this handler itself was cancelled
            if not future.done():
                future.cancel()
            self.metrics.queued.set(self.batcher.depth)

    def decode(self, works: Sequence[Work]) -> list[list[dict[str, Any]] | Expired]:
        """The outputs of requests of one model and one kind (predictions of one decoding
        setting, or scores), decoded together in a decoding worker; :class:`Expired` for
        each request whose deadline passed meanwhile (its decoding stopped there)."""
        if isinstance(works[0][1], Scoring):
            return self._score(works)
        started = time.monotonic()
        served, first, _ = works[0]
        assert isinstance(first, Prediction)
        requests = [p for _, p, _ in works if isinstance(p, Prediction)]
        deadlines = [d for _, _, d in works]
        sources = [s for p in requests for s in p.sources]
        owner = [k for k, p in enumerate(requests) for _ in p.sources]
        # each input seeds its sampling stream by its place in its own request, so that a
        # request's outputs do not depend on the requests it was batched with
        positions = [i for p in requests for i in range(len(p.sources))]
        _, hyps = served.loaded.decode(sources, decode=first.decode, positions=positions,
                                       cancelled=lambda i: deadlines[owner[i]].passed)
        expired = [d.passed for d in deadlines]
        maps = self._attention(served, [p for p, gone in zip(requests, expired) if not gone],
                               [h for h, k in zip(hyps, owner) if not expired[k]])
        live = iter(maps)  # one per input of the requests still wanted
        out: list[list[dict[str, Any]] | Expired] = []
        start = 0
        for p, gone in zip(requests, expired):
            end = start + len(p.sources)
            if gone:
                out.append(Expired())
                self.metrics.expired_inputs.inc(len(p.sources))
            else:
                own = [next(live) for _ in p.sources]
                out.append(answers.outputs(served.loaded, p, hyps[start:end], own if p.attention else None))
            start = end
        tokens = sum(len(h[0].tokens) for h in hyps if h)
        self.metrics.batch(len(works), len(sources), tokens, time.monotonic() - started,
                           worker=current_worker())
        return out

    @staticmethod
    def _attention(served: Served, requests: Sequence[Prediction],
                   hyps: Sequence[list[Hypothesis]]) -> list[Tensor | None]:
        """The encoder-decoder attention [T, S] of each best output whose request asked
        for it (None for the others), by one teacher-forced pass."""
        asked = [p.attention for p in requests for _ in p.sources]
        picked = [i for i, a in enumerate(asked) if a]
        maps: list[Tensor | None] = [None] * len(asked)
        if not picked:
            return maps
        loaded = served.loaded
        sources = [s for p in requests for s in p.sources]
        codec = requests[0].codec  # a batch's requests share their languages (the batcher's key)
        ids = [source_ids(codec, sources[i]) for i in picked]
        targets = [hyps[i][0].tokens if hyps[i] else [] for i in picked]
        weights = attention_weights(loaded.searcher, ids, targets, layer=None, device=loaded.device,
                                    batch_tokens=loaded.config.decode.batch_tokens)
        for i, w in zip(picked, weights):
            maps[i] = w
        return maps

    def _score(self, works: Sequence[Work]) -> list[list[dict[str, Any]] | Expired]:
        """The scores of score requests of one model, computed together (those whose
        deadline has passed: :class:`Expired`)."""
        served = works[0][0]
        expired = [d.passed for _, _, d in works]
        requests = [p for (_, p, _), gone in zip(works, expired) if isinstance(p, Scoring) and not gone]
        decode = served.loaded.config.decode
        with reading(decode):
            scores = score_ids(served.loaded.searcher, [s for r in requests for s in r.sources],
                               [t for r in requests for t in r.targets], batch_tokens=decode.batch_tokens,
                               device=served.loaded.device, precision=decode.precision)
        out: list[list[dict[str, Any]] | Expired] = []
        start = 0
        for r in requests:
            out.append([answers.score(s, alpha=decode.alpha, kind=decode.length_penalty)
                        for s in scores[start:start + len(r.sources)]])
            start += len(r.sources)
        done = iter(out)
        return [Expired() if gone else next(done) for gone in expired]

    def open_stream(self, name: str) -> Stream:
        """A streaming session with the model ``name``, on the decoding workers in turn
        (once the core is running); :meth:`Stream.close` it to free its slot."""
        served = self.model(name)
        if not served.streams:
            raise RequestError("cannot_stream", f"model {name!r} cannot decode a stream (it needs "
                               "scaled-dot encoder-decoder attention, under wait-k, or a learned read policy "
                               "with a causal encoder: monotonic, milk, mocha, mma_hard or mma_il or "
                               "mma_chunk)")
        assert self.batcher is not None, "the core is running"
        self.slots.take()
        return Stream(served, self.settings, self.batcher.workers.next(), self.slots)

    async def _warm_workers(self, workers: Workers) -> None:
        """:meth:`warm` in each worker in turn (the first makes the int8 or oneDNN copies
        that the others then share)."""
        loop = asyncio.get_running_loop()
        for executor in workers:
            await loop.run_in_executor(executor, self.warm)

    def warm(self) -> None:
        """Decode one empty source with each model, so that the first request does not pay
        for the first call's set-up (allocations, int8 or oneDNN copies). The source is
        ids, not text: an empty text is not one that every task can read."""
        for served in self.models.values():
            loaded = served.loaded
            generate(loaded.searcher, [[EOS]], loaded.config.decode, device=loaded.device,
                     position_limit=position_limit(loaded.searcher), shortlist=loaded.shortlist)

    def _warmed(self, future: asyncio.Future[None]) -> None:
        if future.cancelled() or future.exception() is not None:
            log.error("warming the models failed: %s", None if future.cancelled() else future.exception())
            return
        self.ready = True
        log.info("models ready: %s", ", ".join(self.models))
