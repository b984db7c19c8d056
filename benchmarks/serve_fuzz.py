"""Requests generated from the server's OpenAPI description against ``seqtrans serve``.

The server runs in a process of its own; recorded are the count of each status (none may
be 5xx), the time, and the server's RSS after every 1,000 answers.

The requests are those of ``tests/serving/test_fuzz.py`` (``tests/serving/fuzzing.py``):
bodies the schemas allow, the same with a field replaced by any JSON value, any JSON,
JSON that Python reads badly (lone surrogates, NaN, thousands of digits, deep nesting)
and bytes that are not JSON, to every HTTP route, of the model served and of names that
are not. The model is ``RUN_DIR``, or by default an untrained copy model (what the test
serves), under the test's small limits so that each decoding is short.

    python -m benchmarks serve_fuzz --requests 10000 --out benchmarks/results/serve_fuzz.json
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings

from benchmarks.common import arguments, write_results
from benchmarks.serve_load import Server, rss

# the requests of the server's fuzz test (the repository's root is on the path: the runner runs there)
from tests.serving.fuzzing import Request, problem, requests, send

LIMITS = ["--max-wait-ms", "0", "--max-inputs", "4", "--max-input-tokens", "8", "--max-beam", "4",
          "--max-body-bytes", "200000"]  # as test_fuzz.py's server


def run(url: str, pid: int, count: int) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    memory: list[float] = []
    problems: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        schema = client.get("/openapi.json").json()

        @settings(max_examples=count, suppress_health_check=list(HealthCheck), deadline=None, database=None,
                  derandomize=True)
        @given(requests(schema, ["m"]))
        def answered(request: Request) -> None:
            answer = send(client, request)
            statuses[str(answer.status_code)] = statuses.get(str(answer.status_code), 0) + 1
            found = problem(request, answer)
            if found is not None:
                problems.append(found)
            if sum(statuses.values()) % 1000 == 0:
                memory.append(round(rss(pid) / 2**20, 1))

        started = time.monotonic()
        answered()
        seconds = time.monotonic() - started
        alive = client.get("/health").status_code == 200
    return {"requests": sum(statuses.values()), "seconds": round(seconds, 1), "statuses": statuses,
            "problems": problems[:20], "problem_count": len(problems), "alive_after": alive,
            "rss_mib_every_1000": memory}


def main(argv: list[str]) -> int:
    parser = arguments(__doc__)
    parser.add_argument("run_dir", nargs="?", type=Path, help="the model to serve (default: an untrained "
                        "copy model)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-fuzz-") as scratch:
        model = args.run_dir
        if model is None:
            from tests.inference.test_inference import copy_run

            model = copy_run(Path(scratch) / "copy", seed=3, vocab_size=30)
        server = Server(model, *LIMITS)
        try:
            ready = round(rss(server.process.pid) / 2**20, 1)
            result = run(server.url, server.process.pid, args.requests)
        finally:
            status = server.stop()
    memory = result["rss_mib_every_1000"]
    growth = (max(memory[1:]) / memory[0] - 1) if len(memory) > 1 else 0.0
    out = {"model": str(args.run_dir or "untrained copy model (tests/inference/test_inference.py copy_run)"),
           "limits": " ".join(LIMITS), "rss_mib_ready": ready, **result,
           "rss_growth_after_first_1000": round(growth, 3), "exit_status": status}
    print(json.dumps(out, indent=1))
    if args.out is not None:
        write_results(args.out, out, sort_keys=False)
    return 1 if result["problem_count"] or not result["alive_after"] else 0
