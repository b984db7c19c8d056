"""Text in Unicode NFC: ``café`` typed as U+00E9 and as ``e`` + U+0301 is one input, in
training (the subword model and the prepared pairs) and in decoding alike."""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path

import pytest

import seqtrans
from seqtrans import load
from seqtrans_translation import TranslationConfig, TranslationTask
from seqtrans_translation.subwords import Subwords, SubwordSettings, build, train
from seqtrans_translation.task import TranslationCodec

COMPOSED = "Ein café in Zürich, naïve Gäste."
DECOMPOSED = unicodedata.normalize("NFD", COMPOSED)
TEXTS = [f"{COMPOSED} {i}" for i in range(30)] + ["a small house", "a big tree"] * 20


def test_the_two_spellings_are_different_text() -> None:
    assert COMPOSED != DECOMPOSED and "\u0301" in DECOMPOSED


def test_both_spellings_encode_to_the_same_pieces() -> None:
    codec = TranslationCodec(Subwords(train(TEXTS, SubwordSettings(vocab_size=400))))
    assert codec.source_tokens(DECOMPOSED) == codec.source_tokens(COMPOSED)
    assert codec.target_tokens(DECOMPOSED) == codec.target_tokens(COMPOSED)
    assert codec.prediction(codec.target_tokens(DECOMPOSED), "") == COMPOSED


def test_a_subword_model_is_learnt_from_the_normalized_text(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    settings = SubwordSettings(vocab_size=400)
    first = build(iter([unicodedata.normalize("NFD", t) for t in TEXTS]), settings, tmp_path)
    with caplog.at_level(logging.INFO):
        second = build(iter(TEXTS), settings, tmp_path)
    assert "reusing" in caplog.text and first.model == second.model  # one model for both spellings
    assert not any("\u0301" in piece for piece in first.vocab.symbols)


def test_the_data_digest_names_the_normalization(monkeypatch: pytest.MonkeyPatch) -> None:
    # data prepared under another form (or none) must not be reused
    task = TranslationTask(TranslationConfig())
    before = task.train_digest()
    monkeypatch.setattr("seqtrans_translation.task.TEXT_FORM", "NFD")
    assert task.train_digest() != before


def test_a_run_trained_on_one_spelling_decodes_both_alike(tmp_path: Path) -> None:
    english = [f"{DECOMPOSED} number {i}" for i in range(40)]  # the decomposed spelling in training
    german = [f"{DECOMPOSED} Nummer {i}" for i in range(40)]
    for split in ("train", "dev", "test"):
        (tmp_path / f"{split}.en").write_text("\n".join(english) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    files = [f"data.{split}_{side}={tmp_path / f'{split}.{lang}'}"
             for split in ("train", "dev", "test") for side, lang in [("src", "en"), ("tgt", "de")]]
    config = seqtrans.resolve_config("translation", overrides=[
        "data.dataset=none", *files, "data.vocab_size=400", f"data.cache_dir={tmp_path / 'cache'}",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
        "model.heads=2", "train.max_steps=2", "train.max_minutes=0", "train.checkpoint_every=2",
        "train.eval_every=2", "train.keep_checkpoints=1", "train.average_last=1",
        "train.valid_max_examples=2", "decode.beam=1", "decode.max_len_b=6",
        f"train.data_cache={tmp_path / 'prepared'}"])
    seqtrans.run(config, tmp_path / "run", device="cpu")
    loaded = load(tmp_path / "run", device="cpu")
    composed, decomposed = (loaded.task.parse_source(t) for t in (COMPOSED, DECOMPOSED))
    assert loaded.codec.source_tokens(composed) == loaded.codec.source_tokens(decomposed)
    _, hyps = loaded.decode([composed, decomposed])
    assert hyps[0][0].tokens == hyps[1][0].tokens
