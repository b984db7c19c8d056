"""An imported multilingual model served by ``seqtrans serve`` (a real server in its own
process): ``/v1/models`` lists its languages, a request chooses its own, its outputs are
those of decoding in-process with the same languages, and an unknown code is a 422
naming the field and the model's codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hf_models import imported_nllb
from marian_models import SOURCES

from seqtrans import load

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return imported_nllb(tmp_path_factory)


@pytest.fixture(scope="module")
def url(run: Path) -> Iterator[str]:
    port = _free_port()
    command = [sys.executable, "-m", "seqtrans", "serve", f"nllb={run}", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "SEQTRANS_THREADS": "1"})
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"the server ended: {process.communicate()[1]}"
            try:
                if httpx.get(address + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.1)
        yield address
    finally:
        process.terminate()
        process.wait(30)


def test_the_models_languages_are_listed(url: str) -> None:
    described = httpx.get(url + "/v1/models/nllb").json()
    assert described["languages"] == ["eng_Latn", "deu_Latn", "fra_Latn"]


@pytest.mark.parametrize("target", ["deu_Latn", "fra_Latn"])
def test_a_request_chooses_its_target_language(url: str, run: Path, target: str) -> None:
    body = {"inputs": SOURCES[:4], "target_lang": target, "beam": 1}
    answer = httpx.post(url + "/v1/models/nllb/predict", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    expected, _ = load(run, device="cpu", overrides=[f"decode.target_lang={target}", "decode.beam=1"]).decode(
        SOURCES[:4])
    assert [o["output"] for o in answer.json()["outputs"]] == expected


def test_an_unknown_language_is_refused_naming_the_field(url: str) -> None:
    answer = httpx.post(url + "/v1/models/nllb/predict", json={"inputs": ["a cat"], "target_lang": "xx"})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["field"] == "target_lang" and "eng_Latn, deu_Latn, fra_Latn" in error["message"]
