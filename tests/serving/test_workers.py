"""A server with two decoding workers against a real client: concurrent requests decoded
on both workers at once, each request's outputs those of decoding it in-process alone,
each worker computing with its share of the threads; and ``--workers`` refused when it
is not a count."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from servers import post_all, reference, running, streamed
from test_inference import copy_run
from test_stream import SENTENCES, sentence
from websockets.sync.client import connect

from seqtrans import cli
from seqtrans.errors import ConfigError
from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.serving.workers import current_worker

INPUTS = ["1 2 3", "4 5", "6 7 8 9 1", "2", "3 3 3", "9 8 7 6"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tmp_path_factory.mktemp("workers") / "copy", seed=5, vocab_size=30)


@pytest.fixture
def copy_model(run: Path) -> Iterator[Served]:
    served = Served("copy", load(run, device="cpu"))
    yield served
    served.loaded.__dict__.pop("decode", None)  # a test's recording decoder, if any


def _record(served: Served, parties: int) -> list[tuple[str | None, int]]:
    """Make the model's decoding wait until ``parties`` batches decode at once (or fail
    after 20 s), and record the worker and its threads of each batch."""
    seen: list[tuple[str | None, int]] = []
    meeting = threading.Barrier(parties, timeout=20)
    original = served.loaded.decode

    def decode(*args: Any, **kwargs: Any) -> Any:
        seen.append((current_worker(), torch.get_num_threads()))
        meeting.wait()
        return original(*args, **kwargs)

    object.__setattr__(served.loaded, "decode", decode)
    return seen


def test_two_workers_answer_concurrent_requests_at_once_with_in_process_outputs(copy_model: Served) -> None:
    options: list[dict[str, Any]] = [{"beam": 1}, {"beam": 4, "nbest": 2}]  # two batches, one of each
    bodies = [{"inputs": INPUTS[k::2], **options[k]} for k in range(2)]
    with running({"copy": copy_model}, ServeSettings(workers=2, max_wait_ms=200)) as url:
        seen = _record(copy_model, 2)  # a single worker would break this meeting
        answers = post_all(f"{url}/v1/models/copy/predict", bodies)
        metrics = httpx.get(f"{url}/metrics").text
    del copy_model.loaded.decode
    for body, answer in zip(bodies, answers):
        assert answer.status_code == 200, answer.text
        settings = {k: v for k, v in body.items() if k != "inputs"}
        wanted = [reference(copy_model.loaded, t, **settings) for t in body["inputs"]]
        assert answer.json()["outputs"] == wanted
    share = max(1, torch.get_num_threads() // 2)  # the process's threads shared by the two
    assert sorted(seen) == [("0", share), ("1", share)]
    counted = dict(re.findall(r'^seqtrans_worker_batches_total\{worker="(\d)"\} (\S+)$', metrics, re.M))
    assert counted == {"0": "1.0", "1": "1.0"}


def test_one_worker_decodes_batches_one_after_the_other(copy_model: Served) -> None:
    bodies = [{"inputs": INPUTS[:2], "beam": 1}, {"inputs": INPUTS[2:4], "beam": 2}]
    with running({"copy": copy_model}, ServeSettings(max_wait_ms=200)) as url:
        seen = _record(copy_model, 1)
        answers = post_all(f"{url}/v1/models/copy/predict", bodies)
    assert [a.status_code for a in answers] == [200, 200]
    assert [worker for worker, _ in seen] == ["0", "0"]


def test_streaming_sessions_take_the_workers_in_turn_and_get_predict_streams_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.streaming.session import StreamSession

    wait = copy_run(tmp_path / "waitk", seed=2, model=("model.causal_encoder=true", "decode.wait_k=2"))
    served = Served("waitk", load(wait, device="cpu"))
    wanted = streamed(served, SENTENCES)
    workers: list[str | None] = []
    push = StreamSession.push

    def recorded(self: StreamSession, words: Any) -> Any:
        workers.append(current_worker())
        return push(self, words)

    monkeypatch.setattr(StreamSession, "push", recorded)
    with running({"waitk": served}, ServeSettings(workers=2)) as url:
        ws_url = url.replace("http://", "ws://") + "/v1/models/waitk/stream"
        with connect(ws_url) as a, connect(ws_url) as b:
            for words, (tokens, _) in zip(SENTENCES, wanted):
                for ws in (a, b):
                    sent, done, _ = sentence(ws, words)
                    assert " ".join(m["token"] for m in sent) == tokens
    assert set(workers) == {"0", "1"}


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_worker_count_is_a_usage_error_naming_the_flag(run: Path, value: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", str(run), f"--workers={value}"])
    assert exited.value.code == 2 and "--workers" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_settings_from_python_refuse_a_worker_count_that_is_not_one_or_more(value: Any) -> None:
    with pytest.raises(ConfigError, match="workers"):
        ServeSettings(workers=value)
