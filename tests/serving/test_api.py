"""The HTTP API against a real uvicorn server and a real client: outputs equal to decoding
in-process one input at a time (alone and under concurrent requests, batched together),
and every refusal a JSON error naming what was wrong."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from servers import post_all, reference, running, served_copy, wait_ready
from test_inference import copy_run, hand_scores

from seqtrans.data.batches import source_ids, target_ids
from seqtrans.decoding.alignment import layer_weights
from seqtrans.decoding.search import length_penalty
from seqtrans.inference.heatmaps import attend
from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings

INPUTS = ["1 2 3", "4 5", "6 7 8 9 1", "2", "3 3 3", "9 8 7 6", "5 1", "4 4 2 2", "7", "8 6 4", "1 9",
          "2 5 8"]
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return served_copy(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def url(copy_model: Served) -> Iterator[str]:
    with running({"copy": copy_model}, ServeSettings(max_wait_ms=300, max_inputs=8, max_input_tokens=6,
                                                    max_beam=5)) as url:
        yield url


def predict(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/copy/predict", json=body, timeout=30, **kwargs)


def test_the_models_are_listed_with_their_task_settings_and_attention(url: str) -> None:
    listed = httpx.get(f"{url}/v1/models").json()["models"]
    assert [(m["name"], m["task"]) for m in listed] == [("copy", "copy")]
    assert listed[0]["decode"]["beam"] == 3 and listed[0]["attention"]["cross"] == "scaled_dot"
    assert listed[0]["streaming"] is True  # scaled-dot attention streams under wait-k, re-encoding
    assert httpx.get(f"{url}/v1/models/copy").json() == listed[0]
    assert httpx.get(f"{url}/health").json() == {"status": "alive"}
    assert httpx.get(f"{url}/ready").json() == {"status": "ready", "models": ["copy"]}


@pytest.mark.parametrize("options", [{}, {"beam": 1}, {"beam": 4, "nbest": 3, "scores": True},
                                     {"alpha": 0.0, "length_penalty": "power", "scores": True},
                                     {"precision": "int8", "beam": 2, "scores": True}])
def test_outputs_are_those_of_decoding_each_input_alone(url: str, copy_model: Served,
                                                        options: dict[str, Any]) -> None:
    answer = predict(url, {"inputs": INPUTS[:5], **options})
    assert answer.status_code == 200, answer.text
    expected = [reference(copy_model.loaded, text, **options) for text in INPUTS[:5]]
    assert answer.json() == {"model": "copy", "outputs": expected}
    assert any(o["output"] for o in expected)  # the tiny model does write something


def test_attention_maps_are_those_seqtrans_attention_draws(url: str, copy_model: Served) -> None:
    loaded = copy_model.loaded
    answer = predict(url, {"inputs": INPUTS[:4], "attention": True}).json()["outputs"]
    for text, out in zip(INPUTS[:4], answer):
        attended = attend(loaded, text)
        weights = layer_weights(attended.maps.cross, layer=None)[0]  # [T, S], alone and unpadded
        assert out["attention"]["source"] == attended.source
        assert out["attention"]["target"] == attended.outputs
        torch.testing.assert_close(torch.tensor(out["attention"]["weights"]), weights, atol=1e-3, rtol=0)
        assert {k: v for k, v in out.items() if k != "attention"} == reference(loaded, text)


def test_concurrent_requests_are_batched_and_each_gets_its_own_outputs(url: str, copy_model: Served) -> None:
    before = _batches(url)
    requests = [INPUTS[i: i + 1 + i % 3] for i in range(len(INPUTS))]
    options: list[dict[str, Any]] = [{}, {"beam": 1}, {"beam": 4, "nbest": 2}]  # batched apart
    bodies = [{"inputs": r, **options[i % 3]} for i, r in enumerate(requests)]
    answers = post_all(f"{url}/v1/models/copy/predict", bodies)
    for i, (inputs, answer) in enumerate(zip(requests, answers)):
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"] == [reference(copy_model.loaded, t, **options[i % 3]) for t in inputs]
    after = _batches(url)
    assert after[1] - before[1] == len(requests)  # every request decoded once
    assert after[0] - before[0] <= 2 * len(options)  # together: arrived within max_wait_ms of each other


def _batches(url: str) -> tuple[float, float]:
    """(batches decoded, requests in them) from the metrics."""
    text = httpx.get(f"{url}/metrics").text
    count = re.search(r"^seqtrans_batch_requests_count (\S+)$", text, re.M)
    total = re.search(r"^seqtrans_batch_requests_sum (\S+)$", text, re.M)
    assert count and total
    return float(count.group(1)), float(total.group(1))


@pytest.mark.parametrize(("body", "status", "code", "limit"), [
    (b"{\"inputs\": [", 400, "malformed_json", None),
    (b"\xff\xfe", 400, "malformed_json", None),
    ([], 422, "invalid_request", None),
    ({"inputs": "1 2"}, 422, "invalid_request", None),
    ({"inputs": []}, 422, "invalid_request", None),
    ({"inputs": ["1", 2]}, 422, "invalid_request", None),
    ({"inputs": ["1"], "beam": "4"}, 422, "invalid_request", None),
    ({"inputs": ["1"], "beam": True}, 422, "invalid_request", None),
    ({"inputs": ["1"], "scores": 1}, 422, "invalid_request", None),
    ({"inputs": ["1"], "beam": 0}, 422, "invalid_request", None),
    ({"inputs": ["1"], "beam": 2, "nbest": 3}, 422, "invalid_request", None),
    ({"inputs": ["1"], "length_penalty": "cubic"}, 422, "invalid_request", None),
    ({"inputs": ["1"], "precision": "fp8"}, 422, "invalid_request", None),
    ({"inputs": ["1"], "run_dir": "/etc"}, 422, "invalid_request", None),
    ({"inputs": ["1"], "beam": 6}, 422, "beam_too_large", "max_beam"),
    ({"inputs": ["1"] * 9}, 413, "too_many_inputs", "max_inputs"),
    ({"inputs": ["1", "1 2 3 4 5 6 7"]}, 422, "input_too_long", "max_input_tokens"),
])
def test_a_bad_request_gets_a_json_error_naming_the_problem(url: str, body: Any, status: int, code: str,
                                                            limit: str | None) -> None:
    answer = (httpx.post(f"{url}/v1/models/copy/predict", content=body, headers=JSON)
              if isinstance(body, bytes) else predict(url, body))
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error.get("limit") == limit and error["message"]
    assert "Traceback" not in answer.text


def test_unknown_models_routes_and_methods_get_json_errors(url: str) -> None:
    answer = httpx.post(f"{url}/v1/models/../../etc/predict", json={"inputs": ["1"]})
    assert answer.status_code == 404 and answer.json()["error"]["code"] in ("not_found", "unknown_model")
    answer = httpx.post(f"{url}/v1/models/nope/predict", json={"inputs": ["1"]})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_model"
    assert httpx.get(f"{url}/v1/models/copy/predict").json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(f"{url}/nothing").status_code == 404


def test_bad_requests_beside_good_ones_leave_them_their_outputs(url: str, copy_model: Served) -> None:
    bodies = [{"inputs": [t]} if i % 2 else {"inputs": [t], "beam": "x"} for i, t in enumerate(INPUTS)]
    for i, answer in enumerate(post_all(f"{url}/v1/models/copy/predict", bodies)):
        if i % 2:
            assert answer.json()["outputs"] == [reference(copy_model.loaded, INPUTS[i])]
        else:
            assert answer.status_code == 422


def test_metrics_count_requests_by_route_and_status(url: str) -> None:
    predict(url, {"inputs": ["1"]})
    predict(url, {"inputs": 3})
    text = httpx.get(f"{url}/metrics").text
    for status in ("200", "422"):
        line = f'seqtrans_requests_total{{route="/v1/models/{{name}}/predict",status="{status}"}} '
        assert re.search("^" + re.escape(line) + "[1-9]", text, re.M)
    for name in ("seqtrans_request_seconds_bucket", "seqtrans_batch_inputs_bucket",
                 "seqtrans_queue_depth_bucket", "seqtrans_output_tokens_total", "seqtrans_tokens_per_second"):
        assert name in text


def test_the_page_is_served(url: str) -> None:
    page = httpx.get(url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "v1/models" in page.text


def test_a_full_queue_refuses_with_503_and_retry_after(copy_model: Served) -> None:
    settings = ServeSettings(max_queue=2, max_wait_ms=1500)
    with running({"copy": copy_model}, settings) as url:
        answers = post_all(f"{url}/v1/models/copy/predict", [{"inputs": [t]} for t in INPUTS[:6]])
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 2 and statuses.count(503) == 4
    for text, answer in zip(INPUTS, answers):
        if answer.status_code == 503:
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["limit"] == "max_queue"
        else:
            assert answer.json()["outputs"] == [reference(copy_model.loaded, text)]


def test_a_request_not_decoded_in_time_gets_504_and_leaves_the_queue(copy_model: Served) -> None:
    with running({"copy": copy_model}, ServeSettings(max_wait_ms=2000, timeout_s=0.3)) as url:
        answer = predict(url, {"inputs": ["1 2"]})
        assert answer.status_code == 504 and answer.json()["error"]["limit"] == "timeout_s"
        queued = re.search(r"^seqtrans_queued_requests (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
        assert queued and float(queued.group(1)) == 0  # the request left the queue with its answer


def test_a_client_that_disconnects_while_queued_is_withdrawn_and_never_decoded(copy_model: Served) -> None:
    slow = threading.Event()
    original = copy_model.loaded.decode
    decoded: list[list[Any]] = []

    def blocking(sources: list[Any], **kwargs: Any) -> Any:
        decoded.append(list(sources))
        slow.wait(10)
        return original(sources, **kwargs)

    with running({"copy": copy_model}, ServeSettings(max_wait_ms=0)) as url:
        object.__setattr__(copy_model.loaded, "decode", blocking)
        try:
            busy = threading.Thread(target=lambda: predict(url, {"inputs": ["1 2"]}))
            busy.start()  # holds the decoding thread
            while not decoded:
                threading.Event().wait(0.01)
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
                httpx.post(f"{url}/v1/models/copy/predict", json={"inputs": ["3 4 5"]}, timeout=0.5)
            metrics = ""
            for _ in range(100):
                metrics = httpx.get(f"{url}/metrics").text
                if re.search(r"^seqtrans_disconnected_requests_total 1", metrics, re.M):
                    break
                threading.Event().wait(0.05)
            assert re.search(r"^seqtrans_queued_requests 0", metrics, re.M), metrics
            assert re.search(r"^seqtrans_disconnected_requests_total 1", metrics, re.M)
            slow.set()
            busy.join(30)
            assert predict(url, {"inputs": ["6"]}).status_code == 200
        finally:
            slow.set()
            del copy_model.loaded.decode
    assert len(decoded) == 2 and all(len(s) == 1 for s in decoded)  # "3 4 5" never reached the decoder
    assert decoded[1] == [copy_model.loaded.task.parse_source("6")]


def test_with_a_token_every_route_but_the_page_and_probes_needs_it(copy_model: Served) -> None:
    with running({"copy": copy_model}, token="s3cret") as url:
        assert predict(url, {"inputs": ["1"]}).status_code == 401
        wrong = predict(url, {"inputs": ["1"]}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert wrong.json()["error"]["code"] == "unauthorized"
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/metrics").status_code == 401
        right = predict(url, {"inputs": ["1"]}, headers={"Authorization": "Bearer s3cret"})
        assert right.status_code == 200
        assert all(httpx.get(url + path).status_code == 200 for path in ("/", "/health", "/ready"))


def test_the_server_is_alive_but_not_ready_while_its_models_warm_up(copy_model: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from seqtrans.serving.core import Core

    warm = threading.Event()
    monkeypatch.setattr(Core, "warm", lambda self: warm.wait(30))
    with running({"copy": copy_model}, ready=False) as url:
        try:
            assert httpx.get(f"{url}/health").status_code == 200
            waiting = httpx.get(f"{url}/ready")
            assert waiting.status_code == 503 and waiting.headers["retry-after"] == "1"
        finally:
            warm.set()
        wait_ready(url)


def test_decoding_runs_off_the_event_loop(copy_model: Served) -> None:
    """While a batch decodes in the worker thread, the server still answers probes."""
    slow = threading.Event()
    original = copy_model.loaded.decode

    def blocking(*args: Any, **kwargs: Any) -> Any:
        slow.wait(10)
        return original(*args, **kwargs)

    with running({"copy": copy_model}, ServeSettings(max_wait_ms=0)) as url:
        object.__setattr__(copy_model.loaded, "decode", blocking)
        try:
            with httpx.Client(timeout=30) as client:
                result: list[httpx.Response] = []
                worker = threading.Thread(target=lambda: result.append(
                    client.post(f"{url}/v1/models/copy/predict", json={"inputs": ["1 2"]})))
                worker.start()
                assert httpx.get(f"{url}/health", timeout=5).status_code == 200
                slow.set()
                worker.join(30)
        finally:
            slow.set()
            del copy_model.loaded.decode
    assert result[0].status_code == 200


def test_served_models_are_named_by_directory_or_given_names(tmp_path: Path) -> None:
    from seqtrans.errors import UsageError
    from seqtrans.serving.models import model_names

    a = tmp_path / "one" / "run"
    (a / "checkpoints").mkdir(parents=True)
    (a / "checkpoints" / "average.pt").write_bytes(b"")
    assert model_names([str(a), f"other={a}"]) == {"run": str(a), "other": str(a)}
    checkpoint = str(a / "checkpoints" / "average.pt")
    assert model_names([checkpoint]) == {"run": checkpoint}
    with pytest.raises(UsageError, match="two models named 'run'"):
        model_names([str(a), str(tmp_path / "two" / "run")])


def test_an_ensemble_served_by_name_decodes_as_the_ensemble_does_in_process(tmp_path: Path,
                                                                          copy_model: Served) -> None:
    from seqtrans.errors import UsageError
    from seqtrans.inference.loading import load_ensemble
    from seqtrans.serving.models import load_served, model_names

    runs = [str(copy_run(tmp_path / f"copy{seed}", seed=seed, vocab_size=30)) for seed in (3, 4)]
    given = f"both={','.join(runs)}"
    served = load_served("both", model_names([given])["both"], device="cpu")
    ensemble = load_ensemble(runs, device="cpu")
    with running({"both": served, "copy": copy_model}) as url:
        assert httpx.get(f"{url}/v1/models/both").json()["ensemble"] == 2
        answers = post_all(f"{url}/v1/models/both/predict", [{"inputs": [text]} for text in INPUTS[:6]])
    outputs = [a.json()["outputs"][0] for a in answers]
    assert outputs == [reference(ensemble, text) for text in INPUTS[:6]]
    assert outputs != [reference(copy_model.loaded, text) for text in INPUTS[:6]]  # not the first run alone
    with pytest.raises(UsageError, match="an ensemble needs a name"):
        model_names([",".join(runs)])


PAIRS = [["1 2 3", "1 2 3"], ["4 5", "5"], ["6 7 8 9 1", ""], ["2", "2 2 2 2"]]


def test_scores_of_given_pairs_equal_a_hand_loop_of_log_softmax_sums(url: str, copy_model: Served) -> None:
    loaded = copy_model.loaded
    sources = [source_ids(loaded.codec, loaded.task.parse_source(s)) for s, _ in PAIRS]
    targets = [target_ids(loaded.codec, loaded.task.parse_source(t)) for _, t in PAIRS]
    expected = hand_scores(loaded.models, sources, targets)
    answers = post_all(f"{url}/v1/models/copy/score", [{"pairs": PAIRS}, {"pairs": PAIRS[1:2]}])
    scores = answers[0].json()["scores"]
    assert [s["log_prob"] for s in scores] == pytest.approx(expected, abs=1e-4)
    assert [s["tokens"] for s in scores] == [len(t) + 1 for t in targets]
    decode = loaded.config.decode
    for s, total, tgt in zip(scores, expected, targets):
        assert s["per_token"] == pytest.approx(total / (len(tgt) + 1), abs=1e-4)
        lp = float(length_penalty(float(len(tgt) + 1), decode.alpha, kind=decode.length_penalty))
        assert s["normalized_score"] == pytest.approx(total / lp, abs=1e-4)
    assert answers[1].json()["scores"] == [scores[1]]  # batched with the other, its own scores back


@pytest.mark.parametrize(("body", "status", "limit"), [
    ({"pairs": [["1", "2", "3"]]}, 422, None), ({"pairs": [["1", 2]]}, 422, None), ({"pairs": []}, 422, None),
    ({"pairs": [["1", "2"]], "beam": 2}, 422, None), ({"pairs": [["1", "2"]] * 9}, 413, "max_inputs"),
    ({"pairs": [["1", "1 2 3 4 5 6 7"]]}, 422, "max_input_tokens")])
def test_a_bad_score_request_gets_a_json_error(url: str, body: Any, status: int, limit: str | None) -> None:
    answer = httpx.post(f"{url}/v1/models/copy/score", json=body)
    assert answer.status_code == status and answer.json()["error"].get("limit") == limit


def test_the_openapi_description_names_every_route_and_method(url: str, copy_model: Served) -> None:
    from starlette.routing import Route, WebSocketRoute

    from seqtrans.serving.app import build_app

    described = httpx.get(f"{url}/openapi.json").json()["paths"]
    routes = build_app({"copy": copy_model}, ServeSettings()).routes
    served = {r.path: {m.lower() for m in r.methods or () if m != "HEAD"} for r in routes
              if isinstance(r, Route) and r.path != "/"}
    served.update({r.path: {"get"} for r in routes if isinstance(r, WebSocketRoute)})  # the upgrade
    assert {path: set(operations) for path, operations in described.items()} == served


def test_a_body_over_max_body_bytes_is_refused_whether_its_length_is_declared_or_not(url: str) -> None:
    body = b'{"inputs": ["' + b"1 " * 500_000 + b'"]}'  # just over the default 1,000,000 bytes
    declared = httpx.post(f"{url}/v1/models/copy/predict", content=body, headers=JSON)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start:start + 65536]

    # no Content-Length
    streamed = httpx.post(f"{url}/v1/models/copy/predict", content=chunks(), headers=JSON)
    for answer in (declared, streamed):
        assert answer.status_code == 413 and answer.json()["error"]["limit"] == "max_body_bytes"


def test_a_failure_inside_decoding_is_a_json_500_without_a_traceback(copy_model: Served) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a secret internal detail")

    with running({"copy": copy_model}) as url:
        object.__setattr__(copy_model.loaded, "decode", broken)
        try:
            answer = predict(url, {"inputs": ["1 2"]})
        finally:
            del copy_model.loaded.decode
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "internal_error"
        assert "secret" not in answer.text and "Traceback" not in answer.text
        assert predict(url, {"inputs": ["1 2"]}).status_code == 200  # and the server goes on


def test_a_model_served_in_int8_only_refuses_float_precisions(tmp_path: Path) -> None:
    from seqtrans.serving.errors import RequestError
    from seqtrans.serving.requests import parse_predict

    run = copy_run(tmp_path / "copy", seed=3, vocab_size=30)
    served = Served("copy", load(run, overrides=["decode.precision=int8"], device="cpu"))
    settings = ServeSettings()
    assert parse_predict(served, {"inputs": ["1 2"]}, settings).decode.precision == "int8"
    with pytest.raises(RequestError, match="precision fp32 needs float weights.*int8 only") as refused:
        parse_predict(served, {"inputs": ["1 2"], "precision": "fp32"}, settings)
    assert refused.value.status == 422
