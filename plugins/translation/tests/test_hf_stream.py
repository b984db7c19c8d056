"""Streaming an imported pretrained model (tiny models of every family, trained briefly
here), whose encoder reads the whole source: under wait-k the source read so far is
encoded again at each read. Through a session and ``seqtrans predict --stream``: without
a lag, offline greedy decoding's output; with one, tokens written while the sentence
arrives, the forced first tokens (a target language's code, BART's ``<s>``) not written,
and the output from the point the whole source is read on that of offline greedy decoding
continuing it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import LANGUAGES as FAMILY_LANGUAGES
from hf_models import NLLB_LANGUAGES, hf_directory, imported_nllb
from marian_models import SOURCES
from t5_models import t5_directory

import seqtrans
from seqtrans import Loaded, StreamSession, load
from seqtrans_translation.hf import FORMAT as HF_FORMAT

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


def _streams_as_offline_decoding(run: Path, languages: list[str]) -> None:
    """Without a lag, the stream is offline greedy decoding's output; with one, tokens are
    written while the sentence arrives, the forced first tokens (a target language's code,
    BART's ``<s>``) not among them, each seeing no more of the source than its lag allows,
    and from the point the whole source is read the output is offline greedy decoding's
    continuing what was written."""
    loaded = load(run, device="cpu", overrides=[*languages, "decode.beam=1"])
    offline, _ = loaded.decode(SOURCES)
    assert [_session(loaded, text).output for text in SOURCES] == offline  # no lag: the whole source first
    assert len(set(offline)) > 1  # the outputs follow the input

    k = 2
    decode = dataclasses.replace(loaded.config.decode, wait_k=k)
    lagged = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, decode=decode))
    codec = loaded.codec  # a family's codec says what every output starts with (its target_prefix)
    prefix = codec.target_prefix() if hasattr(codec, "target_prefix") else []
    forced = codec.vocabularies.target.encode(prefix)
    early = reached = 0
    for text in SOURCES:
        session = seqtrans.stream(lagged)
        for word in text.split():
            session.push(word)
        before_whole = len(session.tokens)  # written before the source's end was known
        ended = session.done  # an output may end early, on the source it has read
        session.finish()
        ids = [t.id for t in session.tokens]
        assert not forced or ids[:len(forced)] != forced  # forced, not written
        n = session.source_tokens  # its tokens (a source language's code included)
        # written token i is target position len(forced) + i, seeing that many + k source positions
        assert all(t.delay >= min(len(forced) + i + k, n) for i, t in enumerate(session.tokens))
        early += sum(t.delay < n for t in session.tokens)
        if not ended:
            reached += before_whole < len(ids)
            _, hyps = lagged.decode([text], prefixes=[forced + ids[:before_whole]])
            assert hyps[0][0].tokens == forced + ids
    assert early > 0 and reached > 0


def test_an_imported_model_streams_through_a_session(run: Path) -> None:
    _streams_as_offline_decoding(run, LANGUAGES)


@pytest.mark.parametrize("family", ["mbart50", "bart", "t5", "byt5"])
def test_every_family_streams(family: str, tmp_path: Path) -> None:
    if family in ("t5", "byt5"):
        source = t5_directory(family, tmp_path / "hf")
        languages: list[str] = []
    else:
        source = hf_directory(family, tmp_path / "hf")
        _, source_lang, target_lang = FAMILY_LANGUAGES[family]
        languages = [f"decode.source_lang={source_lang}", f"decode.target_lang={target_lang}"] \
            if source_lang else []
    _streams_as_offline_decoding(HF_FORMAT.import_model(source, out=tmp_path / "run"), languages)


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
