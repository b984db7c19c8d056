"""Simultaneous translation over a real WebSocket: the tokens and delays of
``predict --stream`` (:func:`seqtrans.streaming.predict.stream`) decoding the same words,
tokens sent before the sentence has ended, and bad messages or models refused."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import running, streamed
from test_inference import copy_run
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings

SENTENCES = [["1", "2", "3"], ["4", "5", "6", "7", "8"], ["9"]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    root = tmp_path_factory.mktemp("stream")
    causal = ("model.causal_encoder=true",)
    monotonic = (*causal, "model.cross_attention=monotonic")
    runs = {"monotonic": copy_run(root / "monotonic", seed=1, model=monotonic),
            "waitk": copy_run(root / "waitk", seed=2, model=(*causal, "decode.wait_k=2")),
            # an encoder that reads the whole source: the prefix read is encoded again at each read
            "reencoded": copy_run(root / "reencoded", seed=2, model=("decode.wait_k=2",)),
            # a learned policy without a causal encoder cannot stream
            "learned": copy_run(root / "learned", seed=1, model=("model.cross_attention=monotonic",))}
    return {name: Served(name, load(run, device="cpu")) for name, run in runs.items()}


@pytest.fixture(scope="module")
def url(models: dict[str, Served]) -> Iterator[str]:
    with running(models, ServeSettings(max_streams=2, max_input_tokens=6)) as url:
        yield url.replace("http://", "ws://")


def receive(ws: ClientConnection) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=30)))


def sentence(ws: ClientConnection, words: list[str], *,
             written: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Send a sentence word by word; the token messages, the final message, and how many
    tokens had come before its end was sent. ``written`` collects the word messages."""
    tokens: list[dict[str, Any]] = []
    written = [] if written is None else written

    def take(message: dict[str, Any]) -> None:
        (tokens if "token" in message else written).append(message)

    for word in words:
        ws.send(json.dumps({"words": word}))
    try:
        while True:  # what was decided before the end, without waiting for more
            message = json.loads(ws.recv(timeout=0.5))
            if "done" in message:
                return tokens, message, len(tokens)
            take(message)
    except TimeoutError:
        pass
    early = len(tokens)
    ws.send(json.dumps({"end": True}))
    while "done" not in (message := receive(ws)):
        take(message)
    return tokens, message, early


@pytest.mark.parametrize("name", ["monotonic", "waitk", "reencoded"])
def test_a_stream_gets_the_tokens_and_delays_of_predict_stream(url: str, models: dict[str, Served],
                                                               name: str) -> None:
    wanted = streamed(models[name], SENTENCES)
    with connect(f"{url}/v1/models/{name}/stream") as ws:
        for words, (tokens, delays) in zip(SENTENCES, wanted):
            written: list[dict[str, Any]] = []
            sent, done, early = sentence(ws, words, written=written)
            assert " ".join(m["token"] for m in sent) == tokens
            assert [m["delay"] for m in sent] == delays == done["token_delays"]
            assert done["output"] == " ".join(m["token"] for m in sent)  # copy's outputs are its tokens
            # copy's words are its tokens: each is complete when the next is decided, the last
            # when the end is; in words, as every source token is a word
            assert [m["word"] for m in written] == done["output"].split()
            assert [m["delay"] for m in written] == done["delays"]
            assert done["delays"] == [m["word_delay"] for m in sent[1:]] + [len(words)] * bool(sent)
            if name != "monotonic" and len(words) > 2:
                assert early > 0  # wait-2 writes while the sentence is still arriving
    assert any(tokens for tokens, _ in wanted)


def test_a_model_that_cannot_stream_is_refused(url: str) -> None:
    with connect(f"{url}/v1/models/learned/stream") as ws:
        assert receive(ws)["error"]["code"] == "cannot_stream"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


@pytest.mark.parametrize(("message", "code"), [
    ("not json", "malformed_json"), ('{"text": "1"}', "invalid_message"), ('{"words": 3}', "invalid_message"),
    ("[]", "invalid_message"), ('{"words": "1 2 3 4 5 6 7"}', "input_too_long"),
    ('{"words": "1 \\ud800"}', "invalid_request"), ('{"words": "1", "end": NaN}', "invalid_request"),
    ("[" * 100_000 + "]" * 100_000, "invalid_request")])
def test_a_bad_message_gets_an_error_and_the_connection_closes(url: str, message: str, code: str) -> None:
    with connect(f"{url}/v1/models/monotonic/stream") as ws:
        ws.send(message)
        error = receive(ws)["error"]
        assert error["code"] == code
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


def test_sessions_beyond_max_streams_are_refused_and_their_slots_come_back(url: str) -> None:
    with connect(f"{url}/v1/models/monotonic/stream") as a, connect(f"{url}/v1/models/monotonic/stream") as b:
        sentence(a, ["1"])  # both sessions are open and serving
        sentence(b, ["1"])
        with connect(f"{url}/v1/models/monotonic/stream") as c:
            error = receive(c)["error"]
            assert error["code"] == "too_many_streams" and error["limit"] == "max_streams"
    deadline = time.monotonic() + 30
    while "seqtrans_streams 0.0" not in httpx.get(url.replace("ws://", "http://") + "/metrics").text:
        assert time.monotonic() < deadline, "the closed sessions were not let go"
        time.sleep(0.05)
    with connect(f"{url}/v1/models/monotonic/stream") as d:
        assert sentence(d, ["1", "2"])[1]["done"]


def test_a_sentence_longer_than_the_models_positions_gets_an_error_and_the_connection_closes(
        tmp_path: Path) -> None:
    learned = ("model.positions=learned", "model.max_positions=5")
    run = copy_run(tmp_path / "short", seed=1,
                   model=("model.causal_encoder=true", "model.cross_attention=monotonic", *learned))
    with running({"short": Served("short", load(run, device="cpu"))}) as url:
        with connect(url.replace("http://", "ws://") + "/v1/models/short/stream") as ws:
            assert sentence(ws, ["1", "2"])[1]["done"]  # within the positions: decoded
            for word in "1 2 3 4 5 6".split():
                ws.send(json.dumps({"words": word}))
            ws.send(json.dumps({"end": True}))
            while "error" not in (message := receive(ws)):
                assert "token" in message or "word" in message
            assert "model.max_positions" in message["error"]["message"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)


def test_with_a_token_a_session_needs_it_in_a_header_or_the_query(models: dict[str, Served]) -> None:
    from websockets.exceptions import InvalidStatus

    with running({"monotonic": models["monotonic"]}, token="s3cret") as url:
        ws_url = url.replace("http://", "ws://") + "/v1/models/monotonic/stream"
        for wrong in (ws_url, ws_url + "?token=nope"):
            with pytest.raises(InvalidStatus), connect(wrong):
                pass
        with connect(ws_url + "?token=s3cret") as ws:
            assert sentence(ws, ["1"])[1]["done"]
        with connect(ws_url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            assert sentence(ws, ["1"])[1]["done"]


def test_a_silent_session_is_closed_after_its_idle_time_and_its_slot_comes_back(
        models: dict[str, Served]) -> None:
    settings = ServeSettings(max_streams=1, stream_idle_s=0.5)
    with running({"monotonic": models["monotonic"]}, settings) as url:
        ws_url = url.replace("http://", "ws://") + "/v1/models/monotonic/stream"
        with connect(ws_url) as ws:
            started = time.monotonic()
            error = receive(ws)["error"]
            assert error["code"] == "idle_timeout" and error["limit"] == "stream_idle_s"
            assert 0.4 < time.monotonic() - started < 10
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
        with connect(ws_url) as ws:  # the one slot is free again
            assert sentence(ws, ["1", "2"])[1]["done"]


def test_sessions_decode_on_the_servers_decoding_thread(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.streaming.session import StreamSession

    threads: set[str] = set()
    push = StreamSession.push

    def recorded(self: StreamSession, words: Any) -> Any:
        threads.add(threading.current_thread().name)
        return push(self, words)

    monkeypatch.setattr(StreamSession, "push", recorded)
    with connect(f"{url}/v1/models/monotonic/stream") as a, connect(f"{url}/v1/models/waitk/stream") as b:
        assert sentence(a, ["1", "2"])[1]["done"] and sentence(b, ["3", "4"])[1]["done"]
    assert threads and all(name.startswith("seqtrans-decode") for name in threads), threads


@pytest.mark.parametrize("message", ['{"end": 1}', '{"end": 0}', '{"end": "true"}', '{"end": null}',
                                     '{"words": "1", "end": 1}', '{"end": [true]}'])
def test_an_end_that_is_not_true_or_false_is_refused_naming_it(url: str, message: str) -> None:
    with connect(f"{url}/v1/models/monotonic/stream") as ws:
        ws.send(message)
        error = receive(ws)["error"]
        assert error["code"] == "invalid_request" and error["field"] == "end" and "'end'" in error["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


@pytest.mark.parametrize("empty", ['{"end": true}', '{"words": "", "end": true}',
                                   '{"words": " ", "end": true}'])
def test_a_sentence_without_words_ends_with_an_empty_output(url: str, models: dict[str, Served],
                                                            empty: str) -> None:
    [(tokens, delays)] = streamed(models["monotonic"], [SENTENCES[0]])
    with connect(f"{url}/v1/models/monotonic/stream") as ws:
        ws.send(empty)
        assert receive(ws) == {"done": True, "output": "", "delays": [], "token_delays": []}
        sent, done, _ = sentence(ws, SENTENCES[0])  # and the next sentence is decoded as ever
    assert " ".join(m["token"] for m in sent) == tokens and done["token_delays"] == delays


def test_words_after_done_are_skipped_and_the_next_sentence_has_its_own_limit(
        url: str, models: dict[str, Served], monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.streaming.session import StreamSession, Update

    push = StreamSession.push

    def ends_at_once(self: StreamSession, words: Any) -> Update:
        update = push(self, words)
        return Update(update.tokens, update.words, True)  # as if the model had written its end

    six = ["1", "2", "3", "4", "5", "6"]  # the server's max_input_tokens
    [(tokens, delays)] = streamed(models["monotonic"], [six])
    monkeypatch.setattr(StreamSession, "push", ends_at_once)
    with connect(f"{url}/v1/models/monotonic/stream") as ws:
        ws.send(json.dumps({"words": "1"}))
        while "done" not in receive(ws):
            pass
        for _ in range(3):  # 15 more words of the finished sentence: skipped, not counted
            ws.send(json.dumps({"words": "1 2 3 4 5"}))
        ws.send(json.dumps({"end": True}))
        monkeypatch.undo()
        sent, done, _ = sentence(ws, six)  # a full sentence after it: within its own limit
    assert " ".join(m["token"] for m in sent) == tokens and done["token_delays"] == delays
