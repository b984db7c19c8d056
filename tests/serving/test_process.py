"""``seqtrans serve`` as users start it: a process of its own that reads its token from
the environment and, on SIGTERM, answers every request it accepted and exits 0; and the
errors it stops with before serving."""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from servers import post_all, serve_process
from test_inference import copy_run

from seqtrans import cli
from seqtrans.data.batches import prediction
from seqtrans.inference.loading import load

INPUTS = ["1 2 3", "4 5", "6 7 8 9", "2", "3 3", "9 8 7"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tmp_path_factory.mktemp("process") / "copy", seed=3, vocab_size=30)


def test_sigterm_answers_every_accepted_request_then_exits_0(run: Path) -> None:
    loaded = load(run, device="cpu")
    expected = []
    for text in INPUTS:
        source = loaded.task.parse_source(text)
        _, [hyps] = loaded.decode([source])
        expected.append(loaded.task.format(prediction(loaded.codec, hyps[0].tokens, source)))
    auth = {"Authorization": "Bearer tok"}
    # a long wait keeps all the requests queued, however slowly they arrive, until SIGTERM
    with serve_process(f"m={run}", "--max-wait-ms", "10000", "--device", "cpu",
                       env={"SEQTRANS_SERVE_TOKEN": "tok"}) as (url, process):
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the token came from the environment
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.extend(
            post_all(f"{url}/v1/models/m/predict", [{"inputs": [t]} for t in INPUTS], headers=auth)))
        sender.start()
        deadline = time.monotonic() + 120
        while not re.search(rf"^seqtrans_queued_requests {len(INPUTS)}\.0$",
                            httpx.get(f"{url}/metrics", headers=auth).text, re.M):
            assert time.monotonic() < deadline, "the requests did not arrive"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)  # while all of them wait for their batch
        sender.join(60)
        assert process.wait(60) == 0
        output = process.stdout.read() if process.stdout else ""
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health")
    assert [a.status_code for a in answers] == [200] * len(INPUTS)
    assert [a.json()["outputs"][0]["output"] for a in answers] == expected
    assert "Traceback" not in output


def test_without_the_serve_extra_the_error_says_what_to_install(run: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    assert cli.main(["serve", str(run)]) == 2
    error = capsys.readouterr().err
    assert "uvicorn" in error and "pip install 'seqtrans[serve]'" in error


@pytest.mark.parametrize(("args", "message"), [(["--max-queue", "0"], "max_queue"),
                                               (["--port", "70000"], "port")])
def test_bad_settings_stop_it_before_it_loads_anything(run: Path, capsys: pytest.CaptureFixture[str],
                                                       args: list[str], message: str) -> None:
    assert cli.main(["serve", str(run), *args]) == 2
    assert message in capsys.readouterr().err


def test_two_models_of_one_name_are_refused(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", str(run), str(run)]) == 2
    assert "two models named 'copy'" in capsys.readouterr().err


def test_the_token_file_wins_over_the_environment(run: Path, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    with serve_process(f"m={run}", "--device", "cpu", "--token-file", str(secret),
                       env={"SEQTRANS_SERVE_TOKEN": "from-env"}) as (url, _):
        for given, status in [("from-env", 401), ("from-file", 200)]:  # the file's line break dropped
            answer = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {given}"})
            assert answer.status_code == status
        assert httpx.get(f"{url}/health").status_code == 200  # the probes need none


@pytest.mark.parametrize("args", [["--timeout-s", "nan"], ["--header-timeout-s", "inf"],
                                  ["--stream-idle-s", "nan"], ["--max-wait-ms", "nan"]])
def test_a_non_finite_setting_is_a_usage_error_before_anything_loads(
        run: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", str(run), *args])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {args[0]}: expected a finite number" in error
