"""The load benchmark's reading of the server's metrics between two moments."""

from __future__ import annotations

from benchmarks.serve_load import buckets, changes


def _metrics(batches: dict[str, float], **counted: float) -> dict[str, float]:
    out = {f'seqtrans_batch_requests_bucket{{le="{bound}"}}': n for bound, n in batches.items()}
    return {"seqtrans_expired_inputs_total": 0.0, "seqtrans_batch_requests_count": 0.0,
            "seqtrans_batch_requests_sum": 0.0, "seqtrans_decode_seconds_total": 0.0, "server_cpu_s": 0.0,
            "client_cpu_s": 0.0, **out, **counted}


def test_a_histogram_is_read_as_the_observations_of_each_bucket_between_two_moments() -> None:
    before = _metrics({"1.0": 2, "2.0": 3, "4.0": 3, "+Inf": 3})
    after = _metrics({"1.0": 2, "2.0": 5, "4.0": 9, "+Inf": 10})  # 2 of size 2, 4 of 3 or 4, 1 larger
    delta = {key: after[key] - before[key] for key in after}
    assert buckets(delta, "seqtrans_batch_requests_bucket") == {"2": 2, "4": 4, "inf": 1}
    assert buckets(delta, "seqtrans_queue_depth_bucket") == {}


def test_a_level_reports_its_batches_by_size_and_their_mean() -> None:
    before = _metrics({"8.0": 0, "16.0": 0, "+Inf": 0})
    after = _metrics({"8.0": 1, "16.0": 3, "+Inf": 3}, seqtrans_batch_requests_count=3.0,
                     seqtrans_batch_requests_sum=30.0, seqtrans_decode_seconds_total=1.5, server_cpu_s=2.0)
    row = changes(before, after, seconds=2.0)
    assert row["batches"] == 3 and row["mean_batch_requests"] == 10.0
    assert row["batch_requests_histogram"] == {"8": 1, "16": 2}
    assert row["decoding_share"] == 0.75 and row["server_cores"] == 1.0
