"""Load on ``seqtrans serve``: many concurrent users each sending one sentence at a time.

For each number of concurrent users (default 1, 8, 32 and 128), ``--requests`` requests
of single test sentences go to a batching server; the script reports throughput
(sentences/s), p50/p95/p99 latency, errors, refusals (503) and whether every accepted
request got the output that decoding it in-process gives, and the server's RSS before
and after. Beside them, measured in the same run: the same sentences decoded in-process
as one file (the batch ceiling, as ``seqtrans predict`` decodes a file), one sentence
decoded in-process (the latency floor) and a server without batching
(``--max-batch-tokens 1 --max-wait-ms 0``: one request at a time) under the largest
load but one.

    python -m benchmarks serve_load runs/m30k --beam 4                      # the issue's setting
    python -m benchmarks serve_load runs/m30k --users 128 --max-queue 64    # refusals under overload
    python -m benchmarks serve_load runs/m30k --users 32 --requests 10000 --unbatched-requests 0  # memory
    python -m benchmarks serve_load runs/m30k --users 64 --beam 16 --timeout-s 5 \
        --unbatched-requests 0                                              # deadlines

``--rounds R`` runs the load levels in turn R times on the same server, so that levels
compare under the same background load: the results give each level's throughput over
the first level's, per round and their median, with the load average after each level.
Each level also reports what the server did meanwhile (from its metrics and ``/proc``):
its batches and their mean size in requests, the share of the time it spent decoding,
and the cores the server and the clients (this process) kept busy.

    python -m benchmarks serve_load RUN --users 32 64 --rounds 3 --requests 640 \
        --unbatched-requests 0 --max-queue 64                               # 64 users against 32

``--workers W`` serves with W decoding workers (``seqtrans serve --workers``), ``--threads
N`` with N threads each (``seqtrans --threads``); ``--background-load N`` runs N
CPU-burning processes beside everything (the in-process references and the servers) for
the whole run, as on a shared machine.

The sentences are the test split of the run's task (a task that can write its sources
back as text), or ``--inputs FILE``, one per line. Prints a table; ``--out FILE`` also
writes the results as JSON (by convention under benchmarks/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import ROOT, arguments, background_load, write_results
from benchmarks.http_client import ERRORS, Connection, request
from seqtrans.inference.evaluation import read_split
from seqtrans.inference.loading import Loaded, load
from seqtrans.inference.online import predict_batches
from seqtrans.tasks.protocol import SourceFormatting


def sentences(loaded: Loaded, inputs: Path | None) -> list[str]:
    if inputs is not None:
        return [line for line in inputs.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not isinstance(loaded.task, SourceFormatting):
        sys.exit(f"task '{loaded.config.task}' cannot write its sources as text: give --inputs FILE")
    return [loaded.task.format_source(e.source) for e in read_split(loaded.task, "test").examples]


#: The server's metrics a load level reports the change of.
COUNTED = ("seqtrans_expired_inputs_total", "seqtrans_batch_requests_count", "seqtrans_batch_requests_sum",
           "seqtrans_decode_seconds_total")
#: The server's histograms a level reports by bucket: requests per batch, and the queue's
#: depth as each request arrived.
HISTOGRAMS = {"batch_requests": "seqtrans_batch_requests_bucket",
              "queue_depth": "seqtrans_queue_depth_bucket"}


def counters(url: str, pid: int) -> dict[str, float]:
    """The server's :data:`COUNTED` metrics and the buckets of its :data:`HISTOGRAMS` now
    (cumulative, keyed ``NAME_bucket{le="X"}``), its CPU seconds, and this process's."""
    found = dict.fromkeys(COUNTED, 0.0)
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in found or name.startswith(tuple(f"{h}{{" for h in HISTOGRAMS.values())):
            found[name] = float(value)
    # after the name: state ..., utime and stime are fields 14 and 15, in clock ticks
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    found["server_cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    found["client_cpu_s"] = time.process_time()
    return found


def changes(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """What the server did during a level: inputs it stopped decoding at their deadline, its
    batches, their mean size in requests and how many of each size (:func:`buckets`), the
    queue's depth at each arrival by bucket, the share of the time it spent decoding, and
    the CPU seconds of the server and of the clients (this process) per second."""
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    batches = delta["seqtrans_batch_requests_count"]
    mean = round(delta["seqtrans_batch_requests_sum"] / batches, 2) if batches else None
    return {"decoding_stopped_inputs": int(delta["seqtrans_expired_inputs_total"]), "batches": int(batches),
            "mean_batch_requests": mean,
            **{f"{name}_histogram": buckets(delta, metric) for name, metric in HISTOGRAMS.items()},
            "decoding_share": round(delta["seqtrans_decode_seconds_total"] / seconds, 3),
            "server_cores": round(delta["server_cpu_s"] / seconds, 3),
            "client_cores": round(delta["client_cpu_s"] / seconds, 3)}


def buckets(delta: dict[str, float], metric: str) -> dict[str, int]:
    """The observations of a histogram by bucket, each bucket named by its upper bound
    (``"4"``: above the bound before and at most 4), from the change of its cumulative
    ``metric{le="X"}`` counts; empty buckets left out."""
    cumulative = sorted((float(key.split('le="')[1].split('"')[0]), value) for key, value in delta.items()
                        if key.startswith(metric + "{"))
    out, below = {}, 0.0
    for bound, count in cumulative:
        if count > below:
            out["inf" if bound == float("inf") else f"{bound:g}"] = int(count - below)
        below = count
    return out


def rss(pid: int) -> int:
    """Resident memory of a process in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Server:
    """``seqtrans serve`` in a process of its own, on a free port."""

    def __init__(self, run: Path, *args: str, threads: int | None = None, device: str = "cpu") -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        counts = ["--threads", str(threads)] if threads is not None else []
        command = [sys.executable, "-m", "seqtrans", "-q", *counts, "serve", f"m={run}", "--port",
                   str(self.port), "--device", device, *args]
        self.process = subprocess.Popen(command, cwd=ROOT)
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                sys.exit(f"the server exited with status {self.process.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                sys.exit("the server did not become ready")
            time.sleep(0.1)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)


async def load_test(url: str, texts: list[str], expected: list[str], *, users: int, requests: int,
                    beam: int, pid: int | None = None) -> dict[str, Any]:
    """``users`` clients, each sending its next sentence when the last is answered, until
    ``requests`` have been sent; with the server's ``pid``, its RSS after every 1,000
    answers. Each user is a connection of :mod:`benchmarks.http_client`, kept alive: the
    load generator shares the server's cores, so its CPU per request is kept small."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    memory: list[int] = []
    wrong = 0
    sent = 0
    prepared = [request("POST", f"{url}/v1/models/m/predict",
                        body=json.dumps({"inputs": [text], "beam": beam}).encode()) for text in texts]

    async def user(connection: Connection) -> None:
        nonlocal sent, wrong
        while sent < requests:
            i = sent % len(texts)
            sent += 1
            started = time.perf_counter()
            try:
                answer = await connection.send(prepared[i])
            except ERRORS as exc:
                statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
                continue
            statuses[str(answer.status)] = statuses.get(str(answer.status), 0) + 1
            if pid is not None and sum(statuses.values()) % 1000 == 0:
                memory.append(rss(pid))
            if answer.status == 200:
                latencies.append(time.perf_counter() - started)
                wrong += answer.json()["outputs"][0]["output"] != expected[i]

    async with contextlib.AsyncExitStack() as stack:
        connections = [await stack.enter_async_context(Connection(url, timeout=120)) for _ in range(users)]
        started = time.perf_counter()
        await asyncio.gather(*(user(connection) for connection in connections))
        seconds = time.perf_counter() - started
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"users": users, "requests": requests, "seconds": seconds,
            "sentences_per_s": len(latencies) / seconds,
            "p50_ms": 1000 * quantiles[49], "p95_ms": 1000 * quantiles[94], "p99_ms": 1000 * quantiles[98],
            "ok": statuses.get("200", 0), "refused": statuses.get("503", 0),
            "errors": sum(n for s, n in statuses.items() if s not in ("200", "503")), "wrong_outputs": wrong,
            "statuses": statuses, "connections_opened": sum(c.opened for c in connections),
            **({"rss_every_1000_bytes": memory} if pid is not None else {})}


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("run", type=Path, help="The run directory of the model to serve.")
    parser.add_argument("--inputs", type=Path, help="Sentences, one per line (default: the test split).")
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=10_000, help="Requests per load level.")
    parser.add_argument("--unbatched-requests", type=int,
                        help="Requests to the server without batching (default --requests; 0: none).")
    parser.add_argument("--rounds", type=int, default=1,
                        help="Run the load levels in turn this many times on the same server, so that "
                        "each level meets the machine's changes of load alike; each row names its round.")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="Where the server and the in-process references "
                        "decode (cpu, cuda).")
    parser.add_argument("--max-wait-ms", default="5")
    parser.add_argument("--max-queue", default="256")
    parser.add_argument("--timeout-s", help="The server's time limit per request (its default otherwise); "
                                            "each level then reports the inputs whose decoding it stopped.")
    parser.add_argument("--workers", type=int, default=1, help="The server's decoding workers.")
    parser.add_argument("--threads", type=int, help="Threads of each decoding worker (and of the "
                        "in-process references); default: seqtrans's own choice.")
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help="CPU-burning processes running beside everything for the whole run.")
    parser.add_argument("--out", type=Path, help="Also write the results here as JSON.")
    args = parser.parse_args(argv)
    if args.threads is not None:
        from seqtrans.runtime.threads import set_threads

        set_threads(args.threads)
    with background_load(args.background_load):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """The run, as the arguments say (see the module docstring)."""

    loaded = load(args.run, overrides=[f"decode.beam={args.beam}"], device=args.device)
    texts = sentences(loaded, args.inputs)
    started = time.perf_counter()
    expected = list(predict_batches(loaded, [texts]))
    ceiling = len(texts) / (time.perf_counter() - started)
    one = []
    for text in texts[:50]:
        started = time.perf_counter()
        list(predict_batches(loaded, [[text]]))
        one.append(time.perf_counter() - started)
    # what batches of one sentence per user, in arrival order, give in-process: the most a
    # server can reach when its batches hold one request of each user
    grouped = {}
    for users in args.users:
        sample = texts[: max(users, min(len(texts), 512))]
        started = time.perf_counter()
        list(predict_batches(loaded, [sample[i : i + users] for i in range(0, len(sample), users)]))
        grouped[str(users)] = len(sample) / (time.perf_counter() - started)
    results: dict[str, Any] = {"run": args.run.name, "device": args.device, "beam": args.beam,
                               "sentences": len(texts),
                               "timeout_s": float(args.timeout_s) if args.timeout_s else None,
                               "batch_ceiling_sentences_per_s": ceiling,
                               "in_process_batches_of_one_per_user_sentences_per_s": grouped,
                               "in_process_one_sentence_p50_ms": 1000 * statistics.median(one),
                               "cpu_count": os.cpu_count(), "workers": args.workers, "threads": args.threads,
                               "background_load": args.background_load, "batched": [], "unbatched": None}

    limit = ["--timeout-s", args.timeout_s] if args.timeout_s else []
    server = Server(args.run, "--max-wait-ms", args.max_wait_ms, "--max-queue", args.max_queue,
                    "--workers", str(args.workers), *limit, threads=args.threads, device=args.device)
    before = rss(server.process.pid)
    for turn in range(args.rounds):
        for users in args.users:
            before_level = counters(server.url, server.process.pid)
            row = asyncio.run(load_test(server.url, texts, expected, users=users, requests=args.requests,
                                        beam=args.beam, pid=server.process.pid))
            row["rss_after_bytes"] = rss(server.process.pid)
            # inputs whose request passed its limit (504) while their batch decoded: dropped there
            row.update(changes(before_level, counters(server.url, server.process.pid), row["seconds"]))
            row["round"] = turn
            row["load_average"] = [round(x, 2) for x in os.getloadavg()]
            results["batched"].append(row)
            print(json.dumps(row), flush=True)
    results["rss_before_bytes"] = before
    results["throughput_over_first_level"] = ratios(results["batched"], args.users)
    results["server_exit_status"] = server.stop()

    users = sorted(args.users)[-2] if len(args.users) > 1 else args.users[0]
    unbatched_requests = args.requests if args.unbatched_requests is None else args.unbatched_requests
    if unbatched_requests:
        unbatched = Server(args.run, "--max-wait-ms", "0", "--max-batch-tokens", "1",
                           "--max-queue", args.max_queue, threads=args.threads, device=args.device)
        results["unbatched"] = asyncio.run(load_test(unbatched.url, texts, expected, users=users,
                                                     requests=unbatched_requests, beam=args.beam))
        unbatched.stop()

    print_table(results, users)
    if args.out is not None:
        write_results(args.out, results)
        print(f"wrote {args.out}")


def ratios(rows: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    """Each load level's throughput over the first level's in the same round, per round, and
    their median: levels measured in turn compare under the same background load."""
    by_round: dict[int, dict[int, float]] = {}
    for row in rows:
        by_round.setdefault(row.get("round", 0), {})[row["users"]] = row["sentences_per_s"]
    first = levels[0]
    each = {str(users): [round(r[users] / r[first], 3) for r in by_round.values() if r.get(first)]
            for users in levels[1:]}
    return {"over_users": first, "per_round": each,
            "median": {users: statistics.median(v) for users, v in each.items() if v}}


def print_table(results: dict[str, Any], users: int) -> None:
    """The run's table: each load level (and the unbatched server's, at ``users`` users)."""
    ceiling = results["batch_ceiling_sentences_per_s"]
    grouped = results["in_process_batches_of_one_per_user_sentences_per_s"]
    print(f"batch ceiling (in-process, one file): {ceiling:.1f} sentences/s; one sentence in-process: "
          f"{results['in_process_one_sentence_p50_ms']:.1f} ms")
    print("| users | sentences/s | vs ceiling | vs in-process batches of one per user | p50 ms | p95 ms | "
          "p99 ms | refused | errors | wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = results["batched"] + ([{**results["unbatched"], "users": f"{users} (unbatched)"}]
                                 if results["unbatched"] else [])
    for row in rows:
        own = grouped.get(str(row["users"]))
        print(f"| {row['users']} | {row['sentences_per_s']:.1f} | {row['sentences_per_s'] / ceiling:.2f} | "
              f"{row['sentences_per_s'] / own if own else float('nan'):.2f} | "
              f"{row['p50_ms']:.1f} | {row['p95_ms']:.1f} | {row['p99_ms']:.1f} | {row['refused']} | "
              f"{row['errors']} | {row['wrong_outputs']} |")
