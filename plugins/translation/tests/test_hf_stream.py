"""Streaming an imported pretrained model (a tiny NLLB-architecture model, trained briefly
here), whose encoder reads the whole source: under wait-k the source read so far is
encoded again at each read. Through a session and ``seqtrans predict --stream``: without
a lag, offline greedy decoding's output; with one, tokens written while the sentence
arrives, the target language's code forced and not written, and the output from the
point the whole source is read on that of offline greedy decoding continuing it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import NLLB_LANGUAGES, imported_nllb
from marian_models import SOURCES

import seqtrans
from seqtrans import Loaded, StreamSession, load

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LANGUAGES = NLLB_LANGUAGES


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return imported_nllb(tmp_path_factory)


def _session(loaded: Loaded, text: str) -> StreamSession:
    session = seqtrans.stream(loaded)
    for word in text.split():
        session.push(word)
    session.finish()
    return session


def test_an_imported_model_streams_through_a_session(run: Path) -> None:
    loaded = load(run, device="cpu", overrides=[*LANGUAGES, "decode.beam=1"])
    offline, _ = loaded.decode(SOURCES)
    assert [_session(loaded, text).output for text in SOURCES] == offline  # no lag: the whole source first
    assert len(set(offline)) > 1  # the outputs follow the input

    k = 2
    decode = dataclasses.replace(loaded.config.decode, wait_k=k)
    lagged = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, decode=decode))
    forced = loaded.codec.vocabularies.target.encode(["deu_Latn"])
    early = reached = 0
    for text in SOURCES:
        session = _session(lagged, text)
        ids = [t.id for t in session.tokens]
        assert ids[:1] != forced  # the language's code is forced, not written
        n = session.source_tokens  # the source language's code included
        # the code is target position 0: written token i is position i + 1, seeing i + 1 + k positions
        assert all(t.delay >= min(i + 1 + k, n) for i, t in enumerate(session.tokens))
        early += sum(t.delay < n for t in session.tokens)
        before_whole = max(0, n - k)  # the tokens written before a step saw the whole source
        if len(ids) >= before_whole:
            reached += 1
            _, hyps = lagged.decode([text], prefixes=[forced + ids[:before_whole]])
            assert hyps[0][0].tokens == forced + ids
    assert early > 0 and reached > 0


def test_predict_stream_streams_an_imported_model(run: Path) -> None:
    settings = [*LANGUAGES, "decode.wait_k=2"]
    loaded = load(run, device="cpu", overrides=[*settings, "decode.beam=1"])
    expected = []
    for text in SOURCES[:4]:
        session = _session(loaded, text)
        tokens, delays = " ".join(t.text for t in session.tokens), " ".join(map(str, session.token_delays))
        expected.append(f"{tokens}\t{delays}")
    done = subprocess.run([sys.executable, "-m", "seqtrans", "predict", str(run), "--stream", "--device",
                           "cpu", "--set", *settings], input="".join(t + "\n" for t in SOURCES[:4]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
