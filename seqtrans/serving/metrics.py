"""The server's Prometheus metrics, in a registry of its own (one per app, so two servers
in one process never share counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Request counts by endpoint and status, latency, batch sizes, queue depth and
    decoding throughput."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("seqtrans_requests", "HTTP requests answered, by route and status.",
                                ["route", "status"], registry=r)
        self.latency = Histogram("seqtrans_request_seconds", "Time from a request's arrival to its answer.",
                                 ["route"], registry=r,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.batch_requests = Histogram("seqtrans_batch_requests", "Requests decoded together in one batch.",
                                        registry=r, buckets=SIZE_BUCKETS)
        self.batch_inputs = Histogram("seqtrans_batch_inputs", "Inputs decoded together in one batch.",
                                      registry=r, buckets=SIZE_BUCKETS)
        self.queue_depth = Histogram("seqtrans_queue_depth", "Requests waiting, as each request arrives.",
                                     registry=r, buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.queued = Gauge("seqtrans_queued_requests", "Requests waiting to be decoded now.", registry=r)
        self.output_tokens = Counter("seqtrans_output_tokens", "Target tokens decoded (best hypotheses).",
                                     registry=r)
        self.decode_seconds = Counter("seqtrans_decode_seconds", "Time spent decoding batches.", registry=r)
        self.tokens_per_second = Gauge("seqtrans_tokens_per_second",
                                       "Target tokens per second of decoding in the last batch.", registry=r)
        self.disconnected = Counter("seqtrans_disconnected_requests",
                                    "Requests whose client went away before its answer; withdrawn.",
                                    registry=r)
        self.expired_inputs = Counter(
            "seqtrans_expired_inputs", "Inputs whose request passed its time limit or went away while their "
            "batch decoded; their decoding stopped at the next step.", registry=r)
        self.streams = Gauge("seqtrans_streams", "Simultaneous-translation sessions open.", registry=r)
        self.worker_batches = Counter("seqtrans_worker_batches", "Batches decoded, by decoding worker.",
                                      ["worker"], registry=r)

    def batch(self, requests: int, inputs: int, output_tokens: int, seconds: float, *,
              worker: str | None = None) -> None:
        self.batch_requests.observe(requests)
        if worker is not None:
            self.worker_batches.labels(worker=worker).inc()
        self.batch_inputs.observe(inputs)
        self.output_tokens.inc(output_tokens)
        self.decode_seconds.inc(seconds)
        if seconds > 0:
            self.tokens_per_second.set(output_tokens / seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
