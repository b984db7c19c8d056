"""The memory soak's request mix and its RSS sampling, against a real server of a tiny
streaming copy model for a few hundred requests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from servers import running
from test_inference import copy_run

from benchmarks import serve_soak as soak
from benchmarks.serve_load import rss
from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings

TEXTS = ["1 2 3", "4", "5 6 7 8 9 1 2"]
PAIRS = [("1 2 3", "1 2 3"), ("4", "4")]


def test_the_mix_is_seeded_and_holds_every_kind_in_its_proportions() -> None:
    calls = soak.mixed_calls(2000, TEXTS, PAIRS, model="m", streams=True, seed=4)
    assert calls == soak.mixed_calls(2000, TEXTS, PAIRS, model="m", streams=True, seed=4)
    assert calls != soak.mixed_calls(2000, TEXTS, PAIRS, model="m", streams=True, seed=5)
    kinds = Counter(c.kind for c in calls)
    assert set(kinds) == set(soak.MIX)
    for kind, share in soak.MIX.items():
        assert abs(kinds[kind] / 2000 - share / sum(soak.MIX.values())) < 0.03, kind
    bodies = {c: json.loads(c.body) for c in calls if c.kind in ("predict", "nbest", "attention", "penalty")}
    assert {len(b["inputs"]) for b in bodies.values()} == {1, 2, 3, 4}  # requests of several sizes
    assert {t for b in bodies.values() for t in b["inputs"]} == set(TEXTS)  # and inputs of several lengths
    assert all(b["nbest"] > 1 and b["scores"] for c, b in bodies.items() if c.kind == "nbest")
    assert all(b["attention"] for c, b in bodies.items() if c.kind == "attention")
    sessions = [c for c in calls if c.kind == "stream"]
    assert all(c.method == "WS" and json.loads(c.messages[-1]) == {"end": True} for c in sessions)


def test_kinds_the_model_cannot_serve_are_drawn_as_predictions() -> None:
    calls = soak.mixed_calls(500, TEXTS, [], model="m", streams=False)
    assert not {"score", "stream"} & {c.kind for c in calls}
    assert sum(c.kind == "predict" for c in calls) > 500 * 0.4


def test_growth_is_measured_from_the_given_answer_to_the_last() -> None:
    samples = {"500": 90.0, "1000": 100.0, "2000": 108.0, "3000": 104.0}
    assert soak.growth(samples, 1000) == {"growth": 0.04, "max_growth": 0.08}
    assert soak.growth(samples, 3000) == {"growth": None, "max_growth": None}  # nothing after it
    assert soak.growth(samples, 1500) == {"growth": None, "max_growth": None}  # not sampled


@pytest.fixture(scope="module")
def streaming_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tmp_path_factory.mktemp("soak") / "copy", seed=2,
                    model=("model.causal_encoder=true", "decode.wait_k=2"))


def test_a_short_soak_gets_every_kind_answered_and_samples_the_given_process(streaming_copy: Path) -> None:
    texts, pairs, streams = soak.corpus(streaming_copy)
    assert texts and pairs and streams
    calls = soak.mixed_calls(300, texts, pairs, model="m", streams=True, seed=1)
    # the process sampled: one holding 200 MiB that the server's process does not
    held = subprocess.Popen([sys.executable, "-c", "import sys; x = b'1' * (200 << 20); sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        while rss(held.pid) < 200 << 20:
            assert held.poll() is None
        settings = ServeSettings(max_streams=2)
        with running({"m": Served("m", load(streaming_copy, device="cpu"))}, settings) as url:
            result = asyncio.run(soak.soak(url, held.pid, calls, users=4, every=100))
        expected = rss(held.pid) / 2**20
    finally:
        held.kill()
        held.wait()
    assert list(result["rss_mib"]) == ["100", "200", "300"]
    assert all(abs(v - expected) < 5 for v in result["rss_mib"].values())
    outcomes = result["outcomes"]
    assert set(outcomes) == set(soak.MIX)
    assert not [o for c in outcomes.values() for o in c if soak.failure(o)]
    for kind in ("predict", "nbest", "attention", "penalty", "score", "probe"):
        assert set(outcomes[kind]) == {"200"}, kind
    full = {"too_many_streams", "closed 1013"}  # a session beyond max_streams: refused, or closed first
    assert set(outcomes["bad"]) <= {"400", "404", "415", "422", "invalid_message", *full}
    assert len(set(outcomes["bad"]) - full) >= 4
    assert outcomes["stream"].get("ok", 0) > 0
    assert set(outcomes["stream"]) <= {"ok", *full}


def test_memory_is_told_apart_by_where_it_lies() -> None:
    before = soak.anatomy(os.getpid())
    total = sum(v for k, v in before.items() if k not in ("arena_heaps", "threads"))
    assert abs(total - rss(os.getpid()) / 2**20) < 0.02 * total + 2  # every resident page counted once
    held: list[bytearray] = []
    seen: dict[str, float] = {}
    done = threading.Event()

    def hold() -> None:  # blocks over Python's small-object limit come from this thread's glibc arena
        held.extend(bytearray(1000) for _ in range(30_000))
        seen.update(soak.anatomy(os.getpid()))
        done.set()

    worker = threading.Thread(target=hold)
    worker.start()
    worker.join()
    assert done.is_set()
    # 30 MB held in the thread's arena (it may reuse the freed pages of an earlier thread's, so
    # the arenas' size is compared with what is held, not with before), none in the main heap
    assert seen["arenas"] > 25 and seen["arena_heaps"] >= 1
    assert seen["heap"] - before["heap"] < 10
    assert seen["threads"] == before["threads"] + 1
