"""Requests generated from the server's OpenAPI description (``fuzzing.py``) against a
real server: no 5xx, every refusal a JSON error, and the server answering as before once
they are through. ``SEQTRANS_FUZZ_REQUESTS`` sets how many (1,000 by default, a few
seconds' worth; ``benchmarks/serve_fuzz.py`` sends 10,000 to a server process and
follows its memory)."""

from __future__ import annotations

import os

import httpx
import pytest
from fuzzing import Request, problem, requests, send
from hypothesis import HealthCheck, given, settings
from servers import reference, running, served_copy

from seqtrans.serving.settings import ServeSettings

COUNT = int(os.environ.get("SEQTRANS_FUZZ_REQUESTS", "1000"))
#: Small limits keep each decoding short; every limit is still passed by some request.
LIMITS = ServeSettings(max_wait_ms=0, max_inputs=4, max_input_tokens=8, max_beam=4, max_body_bytes=200_000)


def test_no_generated_request_gets_a_5xx(tmp_path_factory: pytest.TempPathFactory) -> None:
    served = served_copy(tmp_path_factory.mktemp("fuzz"))
    statuses: dict[int, int] = {}
    with running({"copy": served}, LIMITS) as url, httpx.Client(base_url=url, timeout=30) as client:
        schema = client.get("/openapi.json").json()

        @settings(max_examples=COUNT, suppress_health_check=list(HealthCheck), deadline=None)
        @given(requests(schema, ["copy"]))
        def answered(request: Request) -> None:
            answer = send(client, request)
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            assert problem(request, answer) is None, problem(request, answer)

        answered()
        after = client.post("/v1/models/copy/predict", json={"inputs": ["1 2 3"]})
        assert after.json()["outputs"] == [reference(served.loaded, "1 2 3")]
    assert sum(statuses.values()) >= COUNT * 0.9
    assert {200, 404, 422} <= set(statuses), statuses  # the draws reach the models, and past the checks
