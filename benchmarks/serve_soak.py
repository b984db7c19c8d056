"""Memory of ``seqtrans serve`` under a long mixed load: its RSS from the 1,000th request on.

A server runs in a process of its own; ``--users`` clients send it ``--requests`` requests
drawn (seeded) from a mix of what a server meets: predictions with beams of 1 to 4,
n-best lists with scores, attention maps and other length penalties, of one to four
inputs of several lengths; score requests; simultaneous-translation WebSocket sessions of
one or two sentences sent a few words at a time (when the model can stream); bad requests
(not JSON, unknown fields, too long, a beam too large, an unknown model, a body not
declared JSON, a bad WebSocket message); and probes (``/health``, ``/metrics``,
``/v1/models``). A WebSocket session counts as one request. The server's RSS (read from
``/proc/PID/status``) is sampled every ``--sample-every`` answers, with where it lies
(:func:`anatomy`: glibc's heaps, Python's and other anonymous mappings, files, and the
threads, from ``/proc/PID/smaps``); the result is its growth
from the ``--from``-th answer (default 1,000) to the last (``--requests``, default 5,000),
which docs/reliability.md promises stays under 5 %. No answer may be a 5xx.

    python -m benchmarks serve_soak --out benchmarks/results/serve_soak-mixed.json
    python -m benchmarks serve_soak RUN_DIR --requests 5000 --users 8

The model is ``RUN_DIR``, or by default a copy model made in a temporary directory
(``seqtrans run copy``: a causal encoder under wait-k, so that it streams; a few hundred
updates, so the run is real but its outputs are not yet right; ``--steps``). The inputs are
the run's test sources, the score pairs its test pairs (where its task writes targets as text).
The server is started with ``--server-args`` (one string, split on spaces) and inherits this
process's environment (``SEQTRANS_MALLOC``, ``MALLOC_ARENA_MAX``: the results record them).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import ROOT, arguments, write_results
from benchmarks.serve_load import Server, rss

#: What a request of each kind is, and how many of a hundred are of it.
MIX = {"predict": 28, "nbest": 12, "attention": 8, "penalty": 5, "score": 14, "stream": 10, "bad": 16,
       "probe": 7}
#: The copy model made when no run is given: small, streaming (causal encoder, wait-k).
COPY_MODEL = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=64", "model.d_ff=128",
              "model.heads=4", "model.causal_encoder=true", "decode.wait_k=3", "data.vocab_size=40",
              "data.max_length=16", "data.train_size=20000", "data.dev_size=50", "data.test_size=200",
              "train.max_tokens=2000", "train.max_minutes=0", "train.warmup=50"]


@dataclass(frozen=True)
class Call:
    """One request of the mix: its ``kind`` (what the results count it under), the HTTP
    ``method`` and ``path`` with its raw ``body`` and ``content_type``; a WebSocket session
    (``method`` "WS") sends ``messages`` (JSON texts) in order."""

    kind: str
    method: str
    path: str
    body: bytes = b""
    content_type: str = "application/json"
    messages: tuple[str, ...] = ()


def _inputs(rng: random.Random, texts: Sequence[str]) -> list[str]:
    """One to four inputs: mostly one, as a user sends, sometimes several of mixed lengths."""
    return [rng.choice(texts) for _ in range(rng.choice((1, 1, 1, 2, 3, 4)))]


def _predict(kind: str, rng: random.Random, texts: Sequence[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": _inputs(rng, texts)}
    if kind == "predict":
        body["beam"] = rng.choice((1, 2, 4))
    elif kind == "nbest":
        body.update(beam=4, nbest=rng.choice((2, 3)), scores=True)
    elif kind == "attention":
        body.update(beam=rng.choice((1, 2)), attention=True)
    else:
        body.update(beam=2, alpha=rng.choice((0.0, 1.0)), length_penalty=rng.choice(("gnmt", "power")))
    return body


def _stream(rng: random.Random, texts: Sequence[str]) -> tuple[str, ...]:
    """A session's messages: one or two sentences, a few words at a time, each ended."""
    messages = []
    for _ in range(rng.choice((1, 2))):
        words = rng.choice(texts).split()
        while words:
            step = rng.randint(1, 3)
            messages.append(json.dumps({"words": " ".join(words[:step])}))
            words = words[step:]
        messages.append(json.dumps({"end": True}))
    return tuple(messages)


def _bad(rng: random.Random, texts: Sequence[str], model: str) -> Call:
    """A request the server refuses (4xx), each kind a client gets wrong."""
    base = f"/v1/models/{model}"
    text = rng.choice(texts)
    choice = rng.randrange(7)
    if choice == 0:
        return Call("bad", "POST", f"{base}/predict", b'{"inputs": ["' + text.encode() + b'"')
    if choice == 1:
        return Call("bad", "POST", f"{base}/predict", json.dumps({"inputs": [text], "beem": 4}).encode())
    if choice == 2:  # longer than the server's max_input_tokens (256)
        too_long = " ".join([text] * 300)
        return Call("bad", "POST", f"{base}/predict", json.dumps({"inputs": [too_long]}).encode())
    if choice == 3:
        return Call("bad", "POST", f"{base}/predict", json.dumps({"inputs": [text], "beam": 99}).encode())
    if choice == 4:
        return Call("bad", "POST", "/v1/models/nosuchmodel/predict", json.dumps({"inputs": [text]}).encode())
    if choice == 5:
        return Call("bad", "POST", f"{base}/score", json.dumps({"inputs": [text]}).encode(), "text/plain")
    return Call("bad", "WS", f"{base}/stream", messages=(json.dumps({"words": 3}),))


def mixed_calls(count: int, texts: Sequence[str], pairs: Sequence[tuple[str, str]], *, model: str,
                streams: bool, seed: int = 0) -> list[Call]:
    """``count`` requests drawn from :data:`MIX` (seeded): kinds the model cannot serve (score
    without ``pairs``, streams without ``streams``) are drawn as predictions instead."""
    rng = random.Random(seed)
    kinds, weights = list(MIX), list(MIX.values())
    base = f"/v1/models/{model}"
    out = []
    for _ in range(count):
        kind = rng.choices(kinds, weights)[0]
        if (kind == "score" and not pairs) or (kind == "stream" and not streams):
            kind = "predict"
        if kind == "score":
            chosen = [list(rng.choice(pairs)) for _ in range(rng.randint(1, 3))]
            out.append(Call(kind, "POST", f"{base}/score", json.dumps({"pairs": chosen}).encode()))
        elif kind == "stream":
            out.append(Call(kind, "WS", f"{base}/stream", messages=_stream(rng, texts)))
        elif kind == "bad":
            out.append(_bad(rng, texts, model))
        elif kind == "probe":
            out.append(Call(kind, "GET", rng.choice(("/health", "/metrics", "/v1/models"))))
        else:
            out.append(Call(kind, "POST", f"{base}/predict", json.dumps(_predict(kind, rng, texts)).encode()))
    return out


async def _session(url: str, call: Call) -> str:
    """A WebSocket session's outcome: "ok" when every sentence got its output, else the
    error's code, or "closed CODE" when the server closed it first."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    ends = sum(json.loads(m).get("end") is True for m in call.messages)
    try:
        async with connect(url.replace("http://", "ws://") + call.path, open_timeout=60) as ws:
            for message in call.messages:
                await ws.send(message)
            while True:  # until each sentence is done, or, for a session that ends none, one answer
                answer = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if "error" in answer:
                    return str(answer["error"]["code"])
                ends -= "done" in answer
                if ends <= 0:
                    break
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else 'without a code'}"
    return "ok"


async def perform(client: httpx.AsyncClient, url: str, call: Call) -> str:
    """Send ``call``; its outcome: the HTTP status, or a WebSocket session's (:func:`_session`)."""
    if call.method == "WS":
        return await _session(url, call)
    if call.method == "GET":
        answer = await client.get(url + call.path)
    else:
        answer = await client.post(url + call.path, content=call.body,
                                   headers={"content-type": call.content_type})
    return str(answer.status_code)


async def soak(url: str, pid: int, calls: Sequence[Call], *, users: int, every: int) -> dict[str, Any]:
    """``users`` clients sending ``calls`` in turn, each its next when the last is answered;
    the outcomes by kind, and the server's RSS (MiB) after every ``every`` answers."""
    outcomes: dict[str, Counter[str]] = {}
    samples: dict[int, float] = {}
    kinds: dict[int, dict[str, float]] = {}
    taken = answered = 0

    async def user(client: httpx.AsyncClient) -> None:
        nonlocal taken, answered
        while taken < len(calls):
            call = calls[taken]
            taken += 1
            try:
                outcome = await perform(client, url, call)
            except (httpx.HTTPError, OSError, asyncio.TimeoutError) as exc:
                outcome = f"exception {type(exc).__name__}"
            outcomes.setdefault(call.kind, Counter())[outcome] += 1
            answered += 1
            if answered % every == 0:
                samples[answered] = round(rss(pid) / 2**20, 1)
                kinds[answered] = anatomy(pid)

    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(user(client) for _ in range(users)))
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 1), "requests_per_s": round(len(calls) / seconds, 1),
            "outcomes": {kind: dict(sorted(c.items())) for kind, c in sorted(outcomes.items())},
            "rss_mib": {str(k): v for k, v in sorted(samples.items())},
            "rss_by_kind_mib": {str(k): v for k, v in sorted(kinds.items())}}


#: glibc gives each thread arena heaps of this size, aligned to it (HEAP_MAX_SIZE, 64-bit).
ARENA_HEAP = 64 << 20


def anatomy(pid: int) -> dict[str, float]:
    """Where a process's resident memory lies (MiB, from ``/proc/PID/smaps``): ``heap``, the
    main thread's glibc heap; ``arenas``, the heaps of glibc's other arenas (anonymous
    read-write mappings that start at a multiple of :data:`ARENA_HEAP`; ``arena_heaps``
    counts them); ``anonymous``, the other anonymous mappings (Python's object arenas,
    thread stacks, blocks mapped on their own); ``files``, mapped files; and ``threads``."""
    resident = dict.fromkeys(("heap", "arenas", "anonymous", "files"), 0)
    heaps = 0
    kind = "files"
    with open(f"/proc/{pid}/smaps", encoding="utf-8") as f:
        for line in f:
            head = line.split(maxsplit=6)
            if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                name = head[5] if len(head) > 5 else ""
                start = int(head[0].split("-")[0], 16)
                if name == "[heap]":
                    kind = "heap"
                elif name and not name.startswith("[stack"):
                    kind = "files"
                elif not name and head[1].startswith("rw") and start % ARENA_HEAP == 0:
                    kind, heaps = "arenas", heaps + 1
                else:
                    kind = "anonymous"
            elif head[0] == "Rss:":
                resident[kind] += int(head[1])  # kB
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return {**{k: round(v / 1024, 1) for k, v in resident.items()}, "arena_heaps": heaps, "threads": threads}


def failure(outcome: str) -> bool:
    """Whether an outcome is the server's failure: a 5xx, a WebSocket session's
    ``internal_error``, or no answer at all (an exception in the client)."""
    return outcome.startswith(("5", "exception ")) or outcome == "internal_error"


def growth(samples: dict[str, float], start: int) -> dict[str, float | None]:
    """The RSS's growth from the ``start``-th answer to the last sample, and its largest
    growth over the start at any sample after it (fractions; None without both samples)."""
    if str(start) not in samples:
        return {"growth": None, "max_growth": None}
    first = samples[str(start)]
    later = [v for k, v in samples.items() if int(k) > start]
    if not later:
        return {"growth": None, "max_growth": None}
    return {"growth": round(later[-1] / first - 1, 4), "max_growth": round(max(later) / first - 1, 4)}


def corpus(run: Path) -> tuple[list[str], list[tuple[str, str]], bool]:
    """The run's test sources as text, its test pairs as text (none where its task cannot
    write targets), and whether the model can stream."""
    from seqtrans.inference.evaluation import read_split
    from seqtrans.inference.loading import load
    from seqtrans.serving.models import Served
    from seqtrans.tasks.protocol import SourceFormatting, TargetParsing, TextForm, TrainingFiles

    loaded = load(run, device="cpu")
    task = loaded.task
    if not isinstance(task, SourceFormatting):
        sys.exit(f"task '{loaded.config.task}' cannot write its sources as text")
    examples = read_split(task, "test").examples
    texts = [task.format_source(e.source) for e in examples]
    pairs: list[tuple[str, str]] = []
    if isinstance(task, TargetParsing) and isinstance(task, (TextForm, TrainingFiles)):
        pairs = [(task.format_source(e.source), task.format_target(e.target)) for e in examples]
    return texts, pairs, Served("m", loaded).streams


def copy_model(directory: Path, steps: int) -> Path:
    """A copy run (:data:`COPY_MODEL`) trained for ``steps`` updates, one thread."""
    out = directory / "copy"
    every = [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}"]
    command = [sys.executable, "-m", "seqtrans", "-q", "--threads", "1", "run", "copy", "--out", str(out),
               "--device", "cpu", "--set", *COPY_MODEL, *every, f"data.cache_dir={directory / 'cache'}"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return out


def main(argv: list[str]) -> int:
    parser = arguments(__doc__)
    parser.add_argument("run", nargs="?", type=Path, help="The run to serve (default: a copy model made "
                        "in a temporary directory).")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--users", type=int, default=8, help="Concurrent clients.")
    parser.add_argument("--sample-every", type=int, default=250, help="Answers between RSS samples.")
    parser.add_argument("--from", dest="start", type=int, default=1000,
                        help="The answer whose RSS the growth is measured from.")
    parser.add_argument("--steps", type=int, default=200, help="Updates of the default copy model.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the request mix.")
    parser.add_argument("--server-args", default="", help="More arguments of seqtrans serve, one string.")
    parser.add_argument("--out", type=Path, help="Also write the results here as JSON.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-soak-") as scratch:
        run = args.run if args.run is not None else copy_model(Path(scratch), args.steps)
        texts, pairs, streams = corpus(run)
        calls = mixed_calls(args.requests, texts, pairs, model="m", streams=streams, seed=args.seed)
        server = Server(run, *args.server_args.split())
        try:
            ready = round(rss(server.process.pid) / 2**20, 1)
            result = asyncio.run(soak(server.url, server.process.pid, calls, users=args.users,
                                      every=args.sample_every))
        finally:
            status = server.stop()
    failed = sum(n for c in result["outcomes"].values() for o, n in c.items() if failure(o))
    out = {"model": str(args.run) if args.run else f"copy model ({args.steps} updates)",
           "requests": args.requests, "users": args.users, "mix": MIX, "rss_mib_ready": ready, **result,
           **growth(result["rss_mib"], args.start), "failed": failed, "exit_status": status}
    print(json.dumps(out, indent=1))
    if args.out is not None:
        write_results(args.out, out, sort_keys=False)
    return 1 if failed or status else 0
